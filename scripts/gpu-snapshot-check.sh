#!/bin/bash
# On the GPU machine: issue 6's checks against PyTorch 2.11, in one call.
#  1. real snapshots of more cases (SNAP=...): a leak (mlp_leak) and a bf16 transformer
#     (gpt2s_b8_sdpa_adamw_bf16), with PyTorch's own `_memory_viz stats` of each;
#  2. speed and memory: `python -m torch.cuda._memory_viz stats` against `gpumem summary` on
#     10 MB, 100 MB and 1 GB snapshots grown from a real one (grow_snapshot.py), each command in
#     a fresh process, wall time and peak RSS;
#  3. gpumem's memory-viz export read by PyTorch's loader (`stats` and `trace_plot`).
# Needs (carried) target/release/gpumem and .gpu/{reference_models.py,grow_snapshot.py}.
set -u
O=${OUT:-/tmp/gpumem-out}
mkdir -p "$O/snaps"
G=$PWD/target/release/gpumem
R=$PWD
cd .gpu
for c in ${CASES:-mlp_leak gpt2s_b8_sdpa_adamw_bf16}; do
  SNAP=$c TAG=case_$c timeout 300 python3 reference_models.py "$O/snaps" $c >>"$O/log.txt" 2>&1 || echo "case $c failed"
  python3 -m torch.cuda._memory_viz stats "$O/snaps/snapshot_$c.pickle" >"$O/snaps/stats_$c.txt" 2>&1
done
W=/tmp/grow; mkdir -p $W
for k in ${GROW:-180:10MB 1800:100MB 18000:1GB}; do
  n=${k%%:*}; tag=${k##*:}
  python3 grow_snapshot.py "$R/fixtures/snapshots/snapshot_mlp_adam.pickle" "$W/snap_$tag.pickle" "$n" >>"$O/log.txt" 2>&1
done
python3 - "$G" "$W" >"$O/bench.json" <<'PY'
import json, os, resource, subprocess, sys, time
g, w = sys.argv[1], sys.argv[2]
def measure(cmd):
    # a fresh wrapper process per command, so ru_maxrss is that command's alone
    code = ("import resource,subprocess,sys,time,json;t=time.time();"
            "p=subprocess.run(sys.argv[1:],stdout=subprocess.DEVNULL,stderr=subprocess.PIPE);"
            "print(json.dumps([time.time()-t,resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss*1024,p.returncode,p.stderr.decode()[-300:]]))")
    out = subprocess.run([sys.executable, "-c", code] + cmd, capture_output=True, text=True).stdout
    return json.loads(out)
rows = []
for tag in ["10MB", "100MB", "1GB"]:
    f = f"{w}/snap_{tag}.pickle"
    if not os.path.exists(f):
        continue
    size = os.path.getsize(f)
    py = [measure([sys.executable, "-m", "torch.cuda._memory_viz", "stats", f]) for _ in range(2 if tag == "1GB" else 3)]
    gm = [measure([g, "summary", f]) for _ in range(3)]
    rows.append({"file": tag, "bytes": size,
                 "pytorch_s": min(p[0] for p in py), "pytorch_rss": min(p[1] for p in py), "pytorch_rc": py[0][2], "pytorch_err": py[0][3],
                 "gpumem_s": min(p[0] for p in gm), "gpumem_rss": min(p[1] for p in gm), "gpumem_rc": gm[0][2], "gpumem_err": gm[0][3]})
    print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
print(json.dumps(rows, indent=1))
PY
# gpumem's export, read by PyTorch's own tools
cd "$R"
$G run fixtures/workloads/presets/mlp_adam.toml --snapshot /tmp/run.json >/dev/null
$G export /tmp/run.json --to memory-viz -o "$O/export.pickle" >>"$O/log.txt" 2>&1
python3 -m torch.cuda._memory_viz stats "$O/export.pickle" >"$O/export_stats.txt" 2>&1; echo "stats rc $?" >>"$O/export_stats.txt"
python3 -m torch.cuda._memory_viz trace_plot "$O/export.pickle" -o /tmp/export.html >>"$O/export_stats.txt" 2>&1; echo "trace_plot rc $? $(wc -c </tmp/export.html)" >>"$O/export_stats.txt"
python3 -m torch.cuda._memory_viz trace "$O/export.pickle" 2>&1 | tail -3 >>"$O/export_stats.txt"
$G summary "$O/export.pickle" --json >"$O/export_summary.json" 2>&1
rm -f "$O/export.pickle"
cd "$O" && tar czf snaps.tgz snaps && rm -rf snaps && ls -la "$O"; cat "$O/bench.json"; tail -5 "$O/export_stats.txt"
