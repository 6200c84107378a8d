#!/bin/bash
# A/B of gpumem builds on the GPU machine's CPU, interleaved in one call (machines differ from
# call to call, so only same-call comparisons mean anything). Binaries in .gpu/bin/gpumem_*.
set -u
lscpu | grep -E "Model name" | head -1
for round in 1 2 3 4; do
  for b in .gpu/bin/gpumem_*; do
    v=${b##*_}
    "$b" bench --repeat 7 --json | python3 -c "
import json,sys; d=json.load(sys.stdin)
print('$v', ' '.join('%s/%s=%.1f' % (r['pattern'], 'on' if r['recording'] else 'off', sorted(r['ns_per_pair'])[3]) for r in d['rows']))"
  done
done
