#!/usr/bin/env bash
# The heavy half of tests/cpu.rs's sim-versus-cpu check, on a many-core host (the GPU machine's
# CPU): each workload runs on `sim` and on `cpu`; memory_stats, the iteration rows (less the
# loss) and the gpumem snapshot (segments, blocks, tagged events) must be identical.
# Usage: scripts/gpu-cpu-heavy.sh BINARY OUT_DIR DEADLINE_SECONDS WORKLOAD...
# Writes OUT_DIR/heavy.jsonl, one line per workload: name, result, seconds on cpu.
set -uo pipefail
bin=$1; out=$2; deadline=$3; shift 3
mkdir -p "$out"
start=$(date +%s)
for w in "$@"; do
  left=$(( deadline - ($(date +%s) - start) ))
  if (( left < 20 )); then echo "{\"workload\": \"$w\", \"result\": \"not run (time)\"}" >> "$out/heavy.jsonl"; continue; fi
  base=$(echo "$w" | tr '/' '_')
  "$bin" run "$w" --device sim --json --no-remedies --snapshot "$out/$base.sim.snap" > "$out/$base.sim.json" 2> "$out/$base.sim.err"
  s=$(date +%s.%N)
  timeout "$left" "$bin" run "$w" --device cpu --json --no-remedies --snapshot "$out/$base.cpu.snap" > "$out/$base.cpu.json" 2> "$out/$base.cpu.err"
  rc=$?
  secs=$(python3 -c "import time; print(round(time.time() - $s, 1))")
  python3 - "$w" "$out/$base" "$rc" "$secs" >> "$out/heavy.jsonl" <<'PY'
import json, sys
w, base, rc, secs = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
def load(d):
    v = json.load(open(f"{base}.{d}.json"))
    for it in v["iterations"]:
        it.pop("loss", None)
    v.pop("device", None)
    return v
if rc != 0 and rc != 1:
    err = open(f"{base}.cpu.err").read()[-300:]
    print(json.dumps({"workload": w, "result": f"cpu exit {rc}", "error": err, "cpu_s": secs}))
    sys.exit()
s, c = load("sim"), load("cpu")
same = {
    "memory_stats": s["memory_stats"] == c["memory_stats"],
    "iterations": s["iterations"] == c["iterations"],
    "report": s == c,
    "snapshot": open(f"{base}.sim.snap", "rb").read() == open(f"{base}.cpu.snap", "rb").read(),
}
losses = [i.get("loss") for i in json.load(open(f"{base}.cpu.json"))["iterations"]]
print(json.dumps({"workload": w, "result": "identical" if all(same.values()) else "DIFFERENT",
                  "same": same, "cpu_s": secs, "losses": losses,
                  "memory_stats_keys": len(s["memory_stats"])}))
PY
  tail -1 "$out/heavy.jsonl"
  rm -f "$out/$base".*.snap
done
