#!/bin/bash
# Records, on the GPU machine, PyTorch's allocation traces of Hugging Face model cases (issue 14):
# each case in a fresh process with ../shared/tools/hf_models.py, memory history with C++ and
# Python stacks (STACKS=all), compacted by scripts/compact_snapshot.py to the ATen op and the
# Python frames of every event. Cases: the names given (hf_models.py's own), or NAME=JSON pairs
# of cases of our own (hf_models.py --case-json). Stops starting cases after $BUDGET seconds.
# Needs (carried) .gpu/hf_models.py: a copy of ../shared/tools/hf_models.py whose
# _record_memory_history takes stacks=os.environ["STACKS"].
set -u
O=${OUT:-/tmp/gpumem-out}
BUDGET=${BUDGET:-480}
mkdir -p "$O/hf"
R=$PWD
start=$(date +%s)
for c in "$@"; do
  if [ $(( $(date +%s) - start )) -gt "$BUDGET" ]; then echo "budget spent: skipped $c"; continue; fi
  name=${c%%=*}
  raw="$O/raw_$name"; mkdir -p "$raw"
  if [ "$name" != "$c" ]; then
    args=(--case-json "{\"name\": \"$name\", ${c#*=}}")
  else
    args=("$name")
  fi
  t0=$(date +%s)
  (cd .gpu && SNAP=$name STACKS=all timeout 300 python3 hf_models.py "$raw" "${args[@]}") 2>"$O/hf/$name.err" | tail -1
  if [ -f "$raw/snapshot_$name.pickle" ]; then
    python3 "$R/scripts/compact_snapshot.py" "$raw/snapshot_$name.pickle" "$O/hf/trace_$name.json"
  else
    echo "case $name: no snapshot: $(tail -3 "$O/hf/$name.err")"
  fi
  cp "$raw/hf_$name.json" "$O/hf/" 2>/dev/null
  rm -rf "$raw"
  echo "case $name: $(( $(date +%s) - t0 )) s"
  # the archive after every case, so a call cut short still brings back what was done
  (cd "$O" && tar czf hf_traces.tgz hf)
done
cd "$O" && rm -rf hf && ls -la "$O"
