#!/usr/bin/env bash
# `--device cuda-memory` on the GPU machine, one call: every fixture workload (presets, OOM
# cases, Hugging Face workloads, FSDP2 and 8-bit optimizer workloads) on the driver's segments
# against --device sim (iteration rows, memory_stats, the OOM), with both runs' times; and
# `--device cuda` (computing) on the presets that fit a quick call, with its launches' split.
# Needs target/release/gpumem carried.
set -uo pipefail
G=target/release/gpumem
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
python3 - "$G" <<'PY' | tee "$OUT/cuda_memory.txt"
import glob, json, subprocess, sys, time
g = sys.argv[1]
def run(w, dev, extra=()):
    t = time.time()
    p = subprocess.run([g, "run", w, "--device", dev, "--json", "--no-remedies", *extra], capture_output=True, text=True)
    dt = time.time() - t
    if p.returncode not in (0, 1):
        return None, dt, p.stderr.strip()[-300:]
    return json.loads(p.stdout), dt, None
ws = sorted(glob.glob("fixtures/workloads/presets/*.toml")) + sorted(glob.glob("fixtures/workloads/*.toml")) \
   + sorted(glob.glob("fixtures/hf/workloads/*.toml")) + sorted(glob.glob("fixtures/dist1/workloads/*.toml")) \
   + sorted(glob.glob("fixtures/opt8/workloads/*.toml"))
fields = ["start", "after_forward", "after_backward", "after_step", "end", "after_generate",
          "peak_allocated", "peak_reserved", "reserved_end"]
same = total = 0; ts = tc = 0.0
for w in ws:
    total += 1
    a, da, ea = run(w, "sim")
    b, db, eb = run(w, "cuda-memory")
    tag = w.split("/")[-1]
    if a is None or b is None:
        print(f"{tag}: ERROR sim={ea} cuda-memory={eb}"); continue
    ts += da; tc += db
    rows = sum(1 for x, y in zip(a["iterations"], b["iterations"]) for f in fields if x.get(f) != y.get(f))
    ms = [k for k in a["memory_stats"] if a["memory_stats"][k] != b["memory_stats"].get(k)]
    oom = (a.get("oom") is None) == (b.get("oom") is None)
    ok = rows == 0 and not ms and oom and b.get("device") == "cuda-memory"
    same += ok
    print(f"{tag}: {'SAME' if ok else 'DIFF'} device={b.get('device')} rows_diff={rows} stats_diff={len(ms)} {ms[:4]} t_sim={da:.2f}s t_cuda_memory={db:.2f}s")
print(f"sim == cuda-memory on {same} of {total} workloads; total time sim {ts:.1f} s, cuda-memory {tc:.1f} s")
PY
echo "== computing on cuda: presets"
for w in fixtures/workloads/presets/mlp_adam.toml fixtures/workloads/presets/x_mlp_s_adamw.toml fixtures/workloads/presets/gpt2_small_sdpa_adamw.toml; do
  /usr/bin/time -f "$w: %e s" $G run $w --device cuda --no-remedies --iterations 2 2>&1 | grep -E "^kernels|loss per|: [0-9.]+ s$|error" | cut -c1-400
done
