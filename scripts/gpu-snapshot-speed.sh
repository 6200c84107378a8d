#!/bin/bash
# Issue 41's snapshot-reading figures on the GPU machine's CPU, in one call: the three grown
# snapshots of the issue's table (grow_snapshot.py from ../shared/tools), `gpumem summary` on
# all cores and on one (GPUMEM_THREADS=1), wall time and peak RSS, each command a fresh
# process; a second binary (OLD, the build before a change) beside it; PyTorch's
# `_memory_viz stats` once per file; and 64 ranks of 100 MB read by one command.
# Needs (carried, not committed) gpu_carry/{grow_snapshot.py,src_mlp.pickle,src_llama.pickle,
# src_kk.pickle} (copies of ../shared/tools/grow_snapshot.py and of the three source snapshots)
# and target/release/gpumem (OLD=path for the other binary). Results in $OUT/snapshot_speed.json.
set -u
O=${OUT:-/tmp/gpumem-out}
D=${DATA:-/tmp/snapspeed}
mkdir -p "$O" "$D"
lscpu | grep -E "Model name|^CPU\(s\)" | head -2
B=${BIN:-target/release/gpumem}
OLD=${OLD:-}
grow() { [ -f "$D/$2" ] || python3 gpu_carry/grow_snapshot.py "gpu_carry/$1" "$D/$2" "$3" | tail -1; }
grow src_mlp.pickle mlp.pickle 17000
grow src_llama.pickle llama.pickle 1280
grow src_kk.pickle kk.pickle 700
python3 - "$O" "$D" "$B" "$OLD" "${VIZ:-1}" <<'PY'
import json, os, resource, subprocess, sys, time
out, d, b, old, viz = sys.argv[1:6]
def run(cmd, env=None):
    # peak RSS from /usr/bin/time (a fresh process each)
    e = dict(os.environ); e.update(env or {})
    t = time.time()
    p = subprocess.run(["/usr/bin/time", "-f", "RSS %M"] + cmd, capture_output=True, env=e)
    s = time.time() - t
    rss = [l for l in p.stderr.decode().splitlines() if l.startswith("RSS ")]
    return {"s": round(s, 3), "rss": int(rss[-1].split()[1]) * 1024 if rss else None, "rc": p.returncode}
rows = []
for f in ["mlp.pickle", "llama.pickle", "kk.pickle"]:
    path = os.path.join(d, f)
    r = {"file": f, "bytes": os.path.getsize(path)}
    for name, exe in [("new", b), ("old", old)]:
        if not exe:
            continue
        for label, env in [("all", {}), ("one", {"GPUMEM_THREADS": "1"})]:
            runs = [run([exe, "summary", path], env) for _ in range(3)]
            r[f"{name}_{label}"] = runs
            print(f, name, label, [x["s"] for x in runs], [x["rss"] for x in runs], flush=True)
    # identical on 1 and all cores
    o1 = subprocess.run([b, "summary", path, "--json"], capture_output=True, env=dict(os.environ, GPUMEM_THREADS="1")).stdout
    o16 = subprocess.run([b, "summary", path, "--json"], capture_output=True).stdout
    r["same_1_and_all"] = o1 == o16
    if viz == "1":
        r["memory_viz"] = run([sys.executable, "-m", "torch.cuda._memory_viz", "stats", path])
        print(f, "memory_viz", r["memory_viz"], flush=True)
    rows.append(r)
# 64 ranks of about 100 MB
rank0 = os.path.join(d, "rank00.pickle")
if not os.path.exists(rank0):
    subprocess.run([sys.executable, "gpu_carry/grow_snapshot.py", "gpu_carry/src_mlp.pickle", rank0, "1780"], check=True)
    for k in range(1, 64):
        subprocess.run(["cp", rank0, os.path.join(d, "rank%02d.pickle" % k)], check=True)
ranks = sorted(os.path.join(d, x) for x in os.listdir(d) if x.startswith("rank"))
r = {"file": "64 ranks", "bytes": sum(os.path.getsize(x) for x in ranks)}
for name, exe in [("new", b), ("old", old)]:
    if exe:
        r[f"{name}_all"] = [run([exe, "summary"] + ranks) for _ in range(2)]
        print("64 ranks", name, r[f"{name}_all"], flush=True)
rows.append(r)
json.dump(rows, open(os.path.join(out, "snapshot_speed.json"), "w"), indent=1)
PY
