#!/usr/bin/env bash
# Issue 15 on the GPU machine, one call: record the iteration-finding snapshots, and time
# `gpumem summary` on 64 ranks of about 100 MB each against one file, on all cores.
# Needs target/release/gpumem and .gpu/grow_snapshot.py (the team's tool) carried.
set -euo pipefail
G=target/release/gpumem
mkdir -p "$OUT/snaps" /tmp/ranks
python3 scripts/record_iteration_snapshots.py "$OUT/snaps"
nproc
python3 .gpu/grow_snapshot.py fixtures/snapshots/snapshot_gpt2s_b8_sdpa_adamw_bf16.pickle /tmp/ranks/rank00.pickle 133
for i in $(seq -w 1 63); do cp /tmp/ranks/rank00.pickle /tmp/ranks/rank$i.pickle; done
du -sh /tmp/ranks
sync
cat /tmp/ranks/*.pickle > /dev/null
/usr/bin/time -f "one file: %e s, %M KB max RSS" $G summary /tmp/ranks/rank00.pickle > /dev/null
/usr/bin/time -f "64 files: %e s, %M KB max RSS" $G summary /tmp/ranks/rank*.pickle > "$OUT/ranks.txt"
/usr/bin/time -f "64 files again: %e s, %M KB max RSS" $G summary /tmp/ranks/rank*.pickle --json > /dev/null
tail -12 "$OUT/ranks.txt"
cd "$OUT" && tar czf snaps.tgz snaps && rm -rf snaps
