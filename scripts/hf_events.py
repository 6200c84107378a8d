"""Extracts from a compacted trace (fixtures/hf/traces/*.json.xz) what tests/hf.rs compares
with gpumem's own trace: every alloc as ["a", requested size] and every completed free as
["f", the ordinal of the allocation it releases] (-1 for one made before the recording).

Usage: python3 hf_events.py TRACE.json.xz OUT.json
"""
import json
import lzma
import sys

t = json.load(lzma.open(sys.argv[1], "rt"))
live, n, out = {}, 0, []
for e in t["events"]:
    if e[0] == "alloc":
        live[e[1]] = n
        out.append(["a", e[2]])
        n += 1
    elif e[0] == "free_completed":
        out.append(["f", live.pop(e[1], -1)])
with open(sys.argv[2], "w") as f:
    json.dump(out, f, separators=(",", ":"))
