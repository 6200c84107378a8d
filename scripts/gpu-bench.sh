#!/bin/bash
# Allocator speed on the GPU machine: PyTorch's C++ allocator (alloc_bench.py) and gpumem's,
# in the same call, same size lists. Needs (carried) target/release/gpumem and .gpu/alloc_bench.py
# (a copy of ../shared/tools/alloc_bench.py; not committed). Results land in $OUT.
set -u
O=${OUT:-/tmp/gpumem-out}
mkdir -p "$O"
lscpu | grep -E "Model name" | head -1
(cd .gpu && python3 alloc_bench.py "$O/torch_bench.json") 2>&1 | tail -2
for i in 1 2 3 4 5; do
  ./target/release/gpumem bench --pytorch "$O/torch_bench.json" --repeat 7 --json > "$O/bench_$i.json"
done
# the same pinned to one core (no migration between cores mid-run)
for i in 1 2 3 4 5; do
  taskset -c 5 ./target/release/gpumem bench --pytorch "$O/torch_bench.json" --repeat 7 --json > "$O/pinned_$i.json"
done
./target/release/gpumem bench --pytorch "$O/torch_bench.json" --repeat 7 | tee "$O/bench_table.txt"
python3 - "$O" <<'PY'
import json, sys, statistics, glob
for kind in ("bench", "pinned"):
  runs = [json.load(open(f)) for f in sorted(glob.glob(sys.argv[1] + "/" + kind + "_*.json"))]
  print("%s: median over %d runs of the per-run median (ns per alloc+free pair):" % (kind, len(runs)))
  for i, r0 in enumerate(runs[0]["rows"]):
    meds = [statistics.median(r["rows"][i]["ns_per_pair"]) for r in runs]
    t = statistics.median(r0["pytorch_ns_per_pair"])
    print("  %-5s recording %-3s gpumem %6.1f (runs %s)  PyTorch %7.1f  ratio %5.1fx" % (
        r0["pattern"], "on" if r0["recording"] else "off", statistics.median(meds),
        " ".join("%.0f" % m for m in meds), t, t / statistics.median(meds)))
PY
(cd "$O" && tar czf runs.tgz bench_*.json pinned_*.json && rm -f bench_*.json pinned_*.json)
