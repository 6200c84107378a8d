"""Extracts from a compacted trace (fixtures/hf/traces/*.json.xz) what tests/hf.rs compares
with gpumem's own trace: every alloc as ["a", requested size] and every completed free as
["f", the ordinal of the allocation it releases] (-1 for one made before the recording).

--drop-benchmarks leaves out the allocations that inductor's benchmarker frees (the L2 flush
buffer and the argument clones of a compiled kernel's timing runs, freed in benchmarking.py),
with their frees; the ordinals count the allocations kept.

Usage: python3 hf_events.py TRACE.json.xz OUT.json [--drop-benchmarks]
"""
import json
import lzma
import sys

t = json.load(lzma.open(sys.argv[1], "rt"))
drop = "--drop-benchmarks" in sys.argv[3:]
events = t["events"]
skip = set()
if drop:
    # an allocation is the benchmarker's when its free comes from benchmarking.py
    at = {}
    for i, e in enumerate(events):
        if e[0] == "alloc":
            at[e[1]] = i
        elif e[0] == "free_completed" and e[1] in at:
            j = at.pop(e[1])
            if "benchmarking.py" in e[4]:
                skip.update((i, j))
live, n, out = {}, 0, []
for i, e in enumerate(events):
    if i in skip:
        continue
    if e[0] == "alloc":
        live[e[1]] = n
        out.append(["a", e[2]])
        n += 1
    elif e[0] == "free_completed":
        out.append(["f", live.pop(e[1], -1)])
with open(sys.argv[2], "w") as f:
    json.dump(out, f, separators=(",", ":"))
