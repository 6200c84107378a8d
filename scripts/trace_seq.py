"""Prints part of a compacted PyTorch trace (fixtures/hf/traces/*.json.xz) with each
allocation's ordinal and, for each free, the ordinal of the allocation it releases: the view
for reading what a piece of modelling code allocates and in which order it lets go.

Usage: python3 trace_seq.py TRACE.json.xz FIRST_EVENT LAST_EVENT
"""
import json
import lzma
import sys


def main():
    t = json.load(lzma.open(sys.argv[1], "rt"))
    first, last = int(sys.argv[2]), int(sys.argv[3])
    live, n = {}, 0
    for i, e in enumerate(t["events"]):
        if i >= last:
            break
        if e[0] == "alloc":
            live[e[1]] = n
            rec = ("a", n)
            n += 1
        elif e[0] == "free_completed":
            rec = ("f", live.pop(e[1], -1))
        else:
            continue
        if i >= first:
            op = e[3].replace("at::native::", "").replace("at::_ops::", "")[:28]
            print(f"{i:7} {rec[0]} #{rec[1]:<6} {e[2]:>12} {op:28} {e[4]}")


if __name__ == "__main__":
    main()
