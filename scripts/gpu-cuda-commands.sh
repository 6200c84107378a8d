#!/usr/bin/env bash
# Issue 17, point 1 on the GPU machine: fit, check and bench take --device cuda, and give the
# simulated device's answers (fit's largest batch, check's figures) with real device memory.
# Needs target/release/gpumem carried.
set -uo pipefail
G=target/release/gpumem
W=fixtures/workloads/presets/mlp_adam.toml
for d in sim cuda; do
  echo "== fit --device $d"; $G fit $W --device $d --capacity 8GiB --no-remedies --json | python3 -c 'import json,sys; d=json.load(sys.stdin); print(d["results"])'
done
$G check $W --device sim --baseline /tmp/b.json --update > /dev/null; echo "check --update (sim) rc=$?"
$G check $W --device cuda --baseline /tmp/b.json > /tmp/c.txt; echo "check --device cuda against the sim baseline rc=$?"; tail -5 /tmp/c.txt
$G bench --workload $W --device cuda --repeat 3
$G bench --workload $W --device sim --repeat 3
