#!/bin/bash
# Records, on the GPU machine, the cases of scripts/extra_model_cases.py (one fresh process each;
# the GPT ones with their op-attributed allocation traces; CASES="..." picks cases). Needs (carried) .gpu/reference_models.py.
set -u
O=${OUT:-/tmp/gpumem-out}
mkdir -p "$O/extra"
R=$PWD
cp scripts/extra_model_cases.py .gpu/
cd .gpu
# CASES="a b" records only those, each with its trace; by default all, traces for the GPT ones.
for c in ${CASES:-$(python3 extra_model_cases.py --list)}; do
  snap=""
  case $c in x_gpt_*) snap=$c ;; esac
  [ -n "${CASES:-}" ] && snap=$c
  SNAP=$snap TAG="case_$c" timeout 300 python3 extra_model_cases.py "$O/extra" "$c" >>"$O/extra/log.txt" 2>&1 || echo "case $c failed"
  if [ -f "$O/extra/snapshot_$c.pickle" ]; then
    python3 "$R/scripts/compact_snapshot.py" "$O/extra/snapshot_$c.pickle" "$O/extra/trace_$c.json"
    rm -f "$O/extra/snapshot_$c.pickle"
  fi
done
cd "$O" && tar czf extra_cases.tgz extra && rm -rf extra && ls -la "$O"
