#!/bin/bash
# Records, on the GPU machine, PyTorch's allocation trace of every case of reference_models.py
# (one fresh process each, with history recording from after the model is built) and compacts
# each snapshot to JSON with the ATen op of every event (scripts/compact_snapshot.py).
# Needs (carried) .gpu/reference_models.py and .gpu/capture_on_gpu.sh (copies of ../shared/tools).
set -u
O=${OUT:-/tmp/gpumem-out}
mkdir -p "$O/models"
R=$PWD
cd .gpu
for c in $(python3 reference_models.py --list); do
  OUT="$O/raw_$c" timeout 300 bash capture_on_gpu.sh model "$c" snapshot >/dev/null 2>"$O/models/$c.err" || echo "case $c failed: $(tail -2 "$O/models/$c.err")"
  if [ -f "$O/raw_$c/snapshot_$c.pickle" ]; then
    python3 "$R/scripts/compact_snapshot.py" "$O/raw_$c/snapshot_$c.pickle" "$O/models/trace_$c.json"
    cp "$O/raw_$c/case_$c.json" "$O/models/case_$c.json"
  fi
  rm -rf "$O/raw_$c"
done
cd "$O" && tar czf model_traces.tgz models && rm -rf models && ls -la "$O"
