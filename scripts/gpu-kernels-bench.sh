#!/bin/bash
# Issue 17's kernel self-test, and issues 14 and 18's simulation benches on the GPU machine's
# CPU with the previous build beside this one, interleaved in the same call. Carry
# target/release/gpumem and target/gpu-base/gpumem (the build to compare with). Results land
# in $OUT.
set -u
O=${OUT:-/tmp/gpumem-out}
mkdir -p "$O"
lscpu | grep -E "Model name" | head -1
./target/release/gpumem selftest --device cuda --json > "$O/selftest.json"
echo "selftest exit $?"
./target/release/gpumem selftest --device cuda > "$O/selftest.txt" 2>&1
tail -40 "$O/selftest.txt"
for w in fixtures/hf/bench/llama3_8b_generate_bf16.toml fixtures/hf/bench/llama3_8b_lora_bf16.toml \
         fixtures/workloads/presets/gpt2_small_sdpa_adamw.toml fixtures/hf/workloads/llama_t_sdpa_adamw_fp32.toml; do
  for r in 1 2 3; do
    for b in target/gpu-base/gpumem target/release/gpumem; do
      echo "$(dirname "$b" | cut -d/ -f2) $("$b" bench --workload "$w" 2>&1 | tail -1)"
    done
  done
done | tee "$O/bench.txt"
for b in target/gpu-base/gpumem target/release/gpumem; do
  echo "== $b"; "$b" bench --repeat 7 2>&1 | tail -6
done | tee -a "$O/bench.txt"
