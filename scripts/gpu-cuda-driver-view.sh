#!/usr/bin/env bash
# Issue 17, the driver's view: what NVML says a `--device cuda` process uses at the end of a
# run, against what the caching allocator reserved (the rest is the CUDA context and what the
# driver loaded), for a few workloads with default and expandable segments.
# Needs target/release/gpumem carried.
set -uo pipefail
G=target/release/gpumem
for w in fixtures/workloads/presets/mlp_adam.toml fixtures/workloads/gpt2_small_adamw.toml \
         fixtures/hf/workloads/llama_s_generate_bf16.toml fixtures/hf/workloads/llama_s_sdpa_adamw_fp32.toml; do
  for conf in "" "expandable_segments:True"; do
    echo "== $w ${conf}"
    if [ -n "$conf" ]; then a=(--alloc-conf "$conf"); else a=(); fi
    $G run "$w" --device cuda "${a[@]}" | grep -A1 "driver's view\|on the NVIDIA" | head -4
    $G run "$w" --device cuda --json "${a[@]}" | python3 -c 'import json,sys; d=json.load(sys.stdin)["driver"]; print("json driver:", d, "outside MiB:", (d["process_used"]-d["reserved"])/2**20)'
  done
done
