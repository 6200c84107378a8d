#!/usr/bin/env bash
# Issue 17's first step on the GPU machine, one call: `gpumem devices`; every fixture workload
# on --device cuda (segments and pages from the driver) against --device sim, default and
# expandable segments; the Hugging Face cases on cuda against PyTorch's recorded figures; and
# issue 18's speed figures on the H200 host's CPU (simulation, allocator pairs, a 1 GB
# snapshot on 1 and all cores).
# Needs target/release/gpumem and target/gpu/grow_snapshot.py (../shared/tools') carried.
set -uo pipefail
G=target/release/gpumem
mkdir -p "$OUT"
echo "== devices"; $G devices; echo "rc=$?"; $G devices --json > "$OUT/devices.json"
nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv
echo "== sim vs cuda"
python3 - "$G" <<'PY' | tee "$OUT/sim_vs_cuda.txt"
import glob, json, subprocess, sys
g = sys.argv[1]
def run(w, dev, extra):
    p = subprocess.run([g, "run", w, "--device", dev, "--json", "--no-remedies"] + extra,
                       capture_output=True, text=True)
    if p.returncode not in (0, 1):
        return None, p.stderr.strip()[-300:]
    return json.loads(p.stdout), None
ws = sorted(glob.glob("fixtures/workloads/presets/*.toml")) + sorted(glob.glob("fixtures/workloads/*.toml")) \
   + sorted(glob.glob("fixtures/hf/workloads/*.toml"))
same = total = 0
for w in ws:
    for extra in ([], ["--alloc-conf", "expandable_segments:True"]):
        total += 1
        a, ea = run(w, "sim", extra)
        b, eb = run(w, "cuda", extra)
        tag = w.split("/")[-1] + (" +exp" if extra else "")
        if a is None or b is None:
            print(f"{tag}: ERROR sim={ea} cuda={eb}"); continue
        fields = ["start", "after_forward", "after_backward", "after_step", "end",
                  "peak_allocated", "peak_reserved", "reserved_end"]
        rows = sum(1 for x, y in zip(a["iterations"], b["iterations"])
                   for f in fields if x.get(f) != y.get(f))
        ms = [k for k in a["memory_stats"] if a["memory_stats"][k] != b["memory_stats"].get(k)]
        oom = (a.get("oom") is None) == (b.get("oom") is None)
        ok = rows == 0 and not ms and oom and b.get("device") == "cuda"
        same += ok
        print(f"{tag}: {'SAME' if ok else 'DIFF'} device={b.get('device')} rows_diff={rows} "
              f"stats_diff={len(ms)} {ms[:4]} oom_sim={a.get('oom') is not None} oom_cuda={b.get('oom') is not None}")
print(f"sim == cuda on {same} of {total} runs")
PY
echo "== hf cases on cuda vs PyTorch"
python3 - "$G" <<'PY' | tee "$OUT/hf_cuda.txt"
import glob, json, subprocess, sys
g = sys.argv[1]
fields = ["start", "after_forward", "after_backward", "after_step", "end", "after_generate",
          "peak_allocated", "peak_reserved", "reserved_end"]
for case in sorted(glob.glob("fixtures/hf/cases/hf_*.json")):
    c = json.load(open(case))["cases"][0]
    w = f"fixtures/hf/workloads/{c['name']}.toml"
    try:
        open(w)
    except OSError:
        continue
    out = {}
    for dev in ("sim", "cuda"):
        p = subprocess.run([g, "run", w, "--device", dev, "--json", "--no-remedies"], capture_output=True, text=True)
        if p.returncode not in (0, 1):
            out[dev] = None; continue
        its = json.loads(p.stdout)["iterations"]
        n = ex = 0
        for t, m in zip(c["iterations"], its):
            for f in fields:
                if f in t and t[f] is not None:
                    n += 1; ex += (t[f] == m.get(f))
        out[dev] = f"{ex}/{n}"
    print(f"{c['name']}: exact fields sim {out['sim']}, cuda {out['cuda']}")
PY
echo "== speed (H200 host CPU)"
nproc
for w in fixtures/workloads/gpt2_small_adamw.toml fixtures/hf/bench/llama3_8b_lora_bf16.toml fixtures/hf/bench/llama3_8b_generate_bf16.toml; do
  $G bench --workload $w --repeat 3
done
$G bench
python3 target/gpu/grow_snapshot.py fixtures/snapshots/snapshot_mlp_adam.pickle /tmp/big.pickle 17800 2>&1 | tail -1 || true
[ -f /tmp/big.pickle ] || python3 target/gpu/grow_snapshot.py "$(ls fixtures/snapshots/snapshot_mlp_adam.pickle)" /tmp/big.pickle 17800
cat /tmp/big.pickle > /dev/null
for t in 1 16; do
  GPUMEM_THREADS=$t /usr/bin/time -f "summary 1 GB, $t threads: %e s, %M KB max RSS" $G summary /tmp/big.pickle > /dev/null 2>/tmp/err.txt; grep -v WARN /tmp/err.txt
done
/usr/bin/time -f "summary 1 GB, all cores: %e s, %M KB max RSS" $G summary /tmp/big.pickle > /dev/null 2>/tmp/err.txt; grep -v WARN /tmp/err.txt
