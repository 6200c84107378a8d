#!/bin/bash
# Issue 37: held-out long generations recorded on the GPU machine (no snapshots: thousands of
# decode steps), their KV caches grown into the large pool, the ids past many 512-byte
# blocks: what `fit --param new_tokens` fast-forwards. Needs gpu_carry/ (hf_families.py,
# hf_models.py from ../shared/tools). Output: $OUT/hf_NAME.json and NAME.config.json.
set -u
O=${OUT:-/tmp/gpumem-out}
mkdir -p "$O"
WIDE='"vocab_size": 16000, "hidden_size": 2048, "intermediate_size": 1408, "num_hidden_layers": 2, "num_attention_heads": 16, "num_key_value_heads": 16, "head_dim": 128, "max_position_embeddings": 8192'
Q3='"vocab_size": 151936, "hidden_size": 1024, "intermediate_size": 3072, "num_hidden_layers": 2, "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128, "tie_word_embeddings": true, "max_position_embeddings": 8192'
GP2='"vocab_size": 16000, "n_embd": 512, "n_layer": 4, "n_head": 8, "n_positions": 1024'
END_AT=${END_AT:-$(( $(date +%s) + 500 ))}
rec() { # name json
  if [[ -n ${ONLY:-} && ! $1 =~ $ONLY ]]; then return; fi
  if (( $(date +%s) > END_AT )); then echo "$1: skipped (deadline)"; return; fi
  local t0=$(date +%s)
  SNAP=${SNAP_OF:+$([[ $1 =~ $SNAP_OF ]] && echo "$1")} timeout 240 python3 scripts/hf_record.py "$O" "{\"name\": \"$1\", $2}" 2>&1 | tail -2
  echo "$1: $(( $(date +%s) - t0 )) s"
}
rec llama_wide_b1_g3000_bf16 "\"model_type\": \"llama\", \"cfg\": {$WIDE}, \"attn\": \"sdpa\", \"batch\": 1, \"seq\": 64, \"weights\": \"bf16\", \"generate\": 3000"
rec qwen3_t_b2_g2500_bf16 "\"model_type\": \"qwen3\", \"cfg\": {$Q3}, \"attn\": \"sdpa\", \"batch\": 2, \"seq\": 200, \"weights\": \"bf16\", \"generate\": 2500"
rec gpt2_t_b8_g900_bf16 "\"family\": \"gpt2\", \"cfg\": {$GP2}, \"attn\": \"sdpa\", \"batch\": 8, \"seq\": 100, \"weights\": \"bf16\", \"generate\": 900"
ls -la "$O"
