#!/bin/bash
# Issue 38, point 4: maps the free device address space of real training processes at chosen
# points (scripts/va_scan.py), for modelling the driver's segment placement. Carry: gpu_carry
# (../shared/tools' hf_models.py). Output: $OUT/va_scan_NAME.json, one row per stop point.
set -u
END_AT=${END_AT:-$(( $(date +%s) + 480 ))}
LT='"family": "llama", "cfg": {"vocab_size": 16000, "hidden_size": 512, "intermediate_size": 1408, "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 2, "max_position_embeddings": 2048}, "attn": "sdpa"'
run() {  # name, case, stops...
  local n=$1 c=$2; shift 2
  if (( $(date +%s) > END_AT )); then echo "$n: skipped (deadline)"; return; fi
  local t0=$(date +%s)
  timeout $(( END_AT + 60 - $(date +%s) )) python3 scripts/va_scan.py "$OUT/va_scan_$n.json" "$c" "$@" 2>&1 | tail -12
  echo "$n: rc=$? $(( $(date +%s) - t0 )) s"
}
run llama_t_sdpa_adamw_fp32 '{"name": "llama_t_sdpa_adamw_fp32", '"$LT"', "batch": 2, "seq": 512, "opt": "adamw"}' 1 2 3 4 5 6 8
run llama_t_generate_bf16 '{"name": "llama_t_generate_bf16", '"$LT"', "batch": 2, "seq": 128, "weights": "bf16", "generate": 16}' 2 3
run resnext50_b8_sgdm_fp32 '{"name": "resnext50_b8_sgdm_fp32", "family": "resnext50_32x4d", "batch": 8, "opt": "sgd_momentum"}' 2 3 4 5
CUDA_MODULE_LOADING=EAGER run llama_t_sdpa_adamw_fp32_eager '{"name": "llama_t_sdpa_adamw_fp32", '"$LT"', "batch": 2, "seq": 512, "opt": "adamw"}' 2 4
ls -la "$OUT"
