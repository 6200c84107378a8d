#!/bin/bash
# Issue 42: records torchao's low-bit optimizers (torchao 0.18.0, carried as a wheel in .whl/)
# around Llama-shaped models on the GPU machine, one fresh process each, with PyTorch's
# snapshot. Carry: gpu_carry (../shared/tools' hf_models.py, hf_families.py) and .whl.
# Output: $OUT/cases.tar.xz (hf_NAME.json, NAME.config.json, snapshot_NAME.pickle.xz).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site
python3 -c 'import torchao, torch, triton; print("torchao", torchao.__version__, "torch", torch.__version__, "triton", triton.__version__)' 2>&1 | tail -1
D=$(mktemp -d)
LS='"vocab_size": 32000, "hidden_size": 1024, "intermediate_size": 2816, "num_hidden_layers": 4, "num_attention_heads": 16, "num_key_value_heads": 4, "max_position_embeddings": 2048'
SM='"vocab_size": 49152, "hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 6, "num_attention_heads": 9, "num_key_value_heads": 3, "max_position_embeddings": 8192, "rope_theta": 100000, "rms_norm_eps": 1e-05, "tie_word_embeddings": true'
# hidden 1000: matrices of 1,000,000 elements are not a multiple of 256 (or 128) blocks
OD='"vocab_size": 32000, "hidden_size": 1000, "intermediate_size": 2700, "num_hidden_layers": 2, "num_attention_heads": 5, "num_key_value_heads": 5, "max_position_embeddings": 2048'
END_AT=${END_AT:-$(( $(date +%s) + 540 ))}
rec() { # name json
  local n=$1 j=$2
  if [[ -n ${ONLY:-} && ! $n =~ $ONLY ]]; then return; fi
  if (( $(date +%s) > END_AT )); then echo "$n: skipped (deadline)"; return; fi
  SNAP=$n timeout 240 python3 scripts/hf_record.py "$D" "{\"name\": \"$n\", $j}" 2>&1 | tail -2
}
T='"batch": 2, "seq": 512'
W960='"vocab_size": 32000, "hidden_size": 960, "intermediate_size": 2560, "num_hidden_layers": 2, "num_attention_heads": 12, "num_key_value_heads": 4, "max_position_embeddings": 2048'
# each case twice, in fresh processes: first with an empty compile cache (inductor autotunes its
# kernels in the first step, benchmarking clones of the arguments), then with the cache the first
# run left (`NAME_warm`: the kernels' configurations are read back, nothing is benchmarked)
both() { rec "$1" "$2"; rec "$1_warm" "$2"; }
both llama_s4_torchao_adamw8bit_fp32 "\"model_type\": \"llama\", \"cfg\": {$LS}, \"attn\": \"sdpa\", $T, \"opt\": \"torchao_adamw8bit\""
both llama_s4_torchao_adamw4bit_fp32 "\"model_type\": \"llama\", \"cfg\": {$LS}, \"attn\": \"sdpa\", $T, \"opt\": \"torchao_adamw4bit\""
both w960_torchao_adamw4bit_fp32 "\"model_type\": \"llama\", \"cfg\": {$W960}, \"attn\": \"sdpa\", $T, \"opt\": \"torchao_adamw4bit\""
both smollm2_6l_torchao_adamw4bit_fp32 "\"model_type\": \"llama\", \"cfg\": {$SM}, \"attn\": \"sdpa\", $T, \"opt\": \"torchao_adamw4bit\""
both odd_torchao_adamw4bit_fp32 "\"model_type\": \"llama\", \"cfg\": {$OD}, \"attn\": \"sdpa\", $T, \"opt\": \"torchao_adamw4bit\""
both llama_s4_torchao_adamw8bit_bf16w "\"model_type\": \"llama\", \"cfg\": {$LS}, \"attn\": \"sdpa\", $T, \"opt\": \"torchao_adamw8bit\", \"weights\": \"bf16\""
both smollm2_6l_torchao_adamw8bit_fp32 "\"model_type\": \"llama\", \"cfg\": {$SM}, \"attn\": \"sdpa\", $T, \"opt\": \"torchao_adamw8bit\""
both llama_s4_torchao_adamw4bit_bf16w "\"model_type\": \"llama\", \"cfg\": {$LS}, \"attn\": \"sdpa\", $T, \"opt\": \"torchao_adamw4bit\", \"weights\": \"bf16\""
w960_8='"model_type": "llama", "cfg": {'"$W960"'}, "attn": "sdpa", '"$T"', "opt": "torchao_adamw8bit"'
both w960_torchao_adamw8bit_fp32 "$w960_8"
cd "$D" && for f in snapshot_*.pickle; do [ -f "$f" ] && xz -T0 "$f"; done
tar -cJf "$OUT/cases.tar.xz" -C "$D" . && ls -la "$D"
