#!/usr/bin/env bash
# One GPU call: issue 15's further iteration snapshots (scripts/record_iteration_snapshots.py,
# the cases not yet in fixtures/snapshots/iterations/), gpumem's summary of each, and issue 17's
# kernel self-test. Carry target/release/gpumem. Results land in $OUT.
set -u
O=${OUT:-/tmp/gpumem-out}
G=target/release/gpumem
mkdir -p "$O/snaps"
python3 scripts/record_iteration_snapshots.py "$O/snaps" eval_keep_losses_4it infer_layers_1pass \
  infer_loop_5batches layerwise_offload
for f in "$O"/snaps/*.pickle; do
  echo "== $f"; $G summary "$f" | grep -iE "iteration|leak" | head -5
done
$G selftest --device cuda --json > "$O/selftest.json"; echo "selftest exit $?"
$G selftest --device cuda > "$O/selftest.txt" 2>&1; tail -8 "$O/selftest.txt"
(cd "$O" && tar czf snaps.tgz snaps && rm -rf snaps)
