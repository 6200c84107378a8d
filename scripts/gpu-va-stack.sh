#!/bin/bash
# Issue 38, point 4: is the ~340 MiB free area that a first forward finds the context's old
# local-memory (stack) reservation, given back when a kernel needs a larger stack? Scans
# llama_t AdamW (scripts/va_scan.py) with the default stack limit and with it raised before the
# model (VA_STACK): if the area then appears at stop 2 (after model.to) instead of during the
# forward (stop 4), it is. Carry: gpu_carry (../shared/tools' hf_models.py).
# Output: $OUT/va_stack_*.json.
set -u
LT='"family": "llama", "cfg": {"vocab_size": 16000, "hidden_size": 512, "intermediate_size": 1408, "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 2, "max_position_embeddings": 2048}, "attn": "sdpa"'
CASE='{"name": "llama_t_sdpa_adamw_fp32", '"$LT"', "batch": 2, "seq": 512, "opt": "adamw"}'
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
for s in "" 2048 4096 16384; do
  t0=$(date +%s)
  VA_STACK=$s PROBES=400 timeout 200 python3 scripts/va_scan.py "$OUT/va_stack_${s:-default}.json" "$CASE" 2 3 4 2>&1 | tail -4
  echo "stack ${s:-default}: rc=$? $(( $(date +%s) - t0 )) s"
done
python3 - "$OUT" <<'PY'
import json, sys, glob, os
MIB = 1 << 20
for f in sorted(glob.glob(os.path.join(sys.argv[1], "va_stack_*.json"))):
    for r in json.load(open(f)):
        if "error" in r:
            print(os.path.basename(f), r["stop"], "error", r["error"][-200:]); continue
        segs = sorted(s[0] for s in r["segments"])
        base = segs[0] if segs else 0
        p = sorted(r["probes"])
        # runs of contiguous 2 MiB probes: the free areas found, lowest first
        runs, start, prev = [], p[0], p[0]
        for a in p[1:]:
            if a != prev + 2 * MIB:
                runs.append((start, prev + 2 * MIB)); start = a
            prev = a
        runs.append((start, prev + 2 * MIB))
        big = [((a - base) // MIB, (b - a) // MIB) for a, b in runs if b - a >= 16 * MIB]
        print(os.path.basename(f), "stop", r["stop"], "stack", r["stack_limit"], "driver_used MiB", r["driver_used"] // MIB,
              "areas>=16MiB (offset from first segment, size) MiB:", big[:6])
PY
