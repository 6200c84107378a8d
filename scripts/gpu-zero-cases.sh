#!/bin/bash
# Issue 39: records DeepSpeed ZeRO stage 1, 2 and 3 cases at world size 1 on the GPU machine
# (scripts/zero_record.py; DeepSpeed 0.19.6's sdist and its pure-Python dependencies carried
# as files in .whl/ds, installed with --no-index into /tmp/site), one fresh process each with
# PyTorch's snapshot; then issue 37's held-out long generation (figures only).
# Carry: gpu_carry (../shared/tools' hf_models.py, hf_families.py, dist1.py) and .whl/ds
# (scripts/fetch-deepspeed-wheels.sh fills it).
# Output: $OUT/zero.tar.xz (zero_NAME.json, snapshot_NAME.pickle.xz, logs), $OUT/gen.tar.xz.
set -u
END_AT=${END_AT:-$(( $(date +%s) + 500 ))}
mkdir -p /tmp/site
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/ds/*.whl 2>&1 | tail -3
export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH
# DeepSpeed's op builder cannot parse torch's "9.0a" architecture names: name the GPU's
export TORCH_CUDA_ARCH_LIST=$(python3 -c 'import torch; print("%d.%d" % torch.cuda.get_device_capability())')
DS_BUILD_OPS=0 python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-cache-dir --target /tmp/site .whl/ds/deepspeed-*.tar.gz 2>&1 | tail -5
python3 -c 'import deepspeed, torch; print("deepspeed", deepspeed.__version__, "torch", torch.__version__)' 2>&1 | tail -2
which ninja nvcc; nvcc --version | tail -1
# DeepSpeed's JIT-built ops kept in the (ignored) carry folder while the machine stays warm
export TORCH_EXTENSIONS_DIR=${TORCH_EXTENSIONS_DIR:-$PWD/gpu_carry/torch_extensions}
D=$(mktemp -d)
for n in ${CASES:-zero2_llama_s_adamw_fp32 zero2_llama_s_offload_fp32 zero1_llama_s_adamw_fp32 zero2_llama_s_adamw_bf16 zero2_llama_s_bucket1e7_fp32 zero2_llama_s_b1_s64_fp32 zero1_llama_s_offload_fp32}; do
  if (( $(date +%s) > END_AT )); then echo "$n: skipped (deadline)"; continue; fi
  t0=$(date +%s)
  timeout 300 python3 scripts/zero_record.py "$D" "$n" > "$D/log_$n.txt" 2>&1
  echo "$n: rc=$? $(( $(date +%s) - t0 )) s"; tail -3 "$D/log_$n.txt"
done
( cd "$D" && for f in snapshot_*.pickle; do [ -f "$f" ] && xz -T0 "$f"; done )
tar -cJf "$OUT/zero.tar.xz" -C "$D" .
G=$(mktemp -d)
if [[ -z ${NO_GEN:-} ]] && (( $(date +%s) < END_AT + 40 )); then
  echo "== long generation"; timeout ${GEN_TIMEOUT:-240} python3 scripts/hf_record.py "$G" '{"name": "llama_2l_long_generate_bf16", "model_type": "llama", "cfg": {"vocab_size": 32000, "hidden_size": 1024, "intermediate_size": 2816, "num_hidden_layers": 2, "num_attention_heads": 8, "num_key_value_heads": 8, "max_position_embeddings": 16384}, "attn": "sdpa", "batch": 1, "seq": 512, "weights": "bf16", "generate": '"${GEN_TOKENS:-4096}"'}' 2>&1 | tail -3
  tar -cJf "$OUT/gen.tar.xz" -C "$G" .
fi
