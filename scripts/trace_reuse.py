"""Finds where gpumem's best-fit choices part from PyTorch's although the events agree: for
each allocation after the setup, which earlier allocation last started at the same address
(-1: fresh memory from a split or a new segment). The first allocations whose choice differs
are printed: a tie between same-size free blocks that the driver's addresses broke the other
way.

Usage: python3 trace_reuse.py GPUMEM_SNAPSHOT.json TORCH_TRACE.json.xz [N]
"""
import json
import lzma
import sys


def choices(events):
    last, out, n = {}, [], 0
    for action, addr, size, where in events:
        if action == "alloc":
            out.append((size, last.get(addr, -1), where))
            last[addr] = n
            n += 1
    return out


def main():
    g = json.load(open(sys.argv[1]))
    stacks = g["stacks"]
    mine = [
        (e["action"], e["addr"], e["size"], "/".join(stacks[e["stack"]]))
        for e in g["trace"]["events"]
        if stacks[e["stack"]][0] != "setup"
    ]
    t = json.load(lzma.open(sys.argv[2], "rt") if sys.argv[2].endswith(".xz") else open(sys.argv[2]))
    theirs = [(e[0], e[1], e[2], f"{e[3]} | {e[4]}") for e in t["events"]]
    limit = int(sys.argv[3]) if len(sys.argv) > 3 else 5
    shown = 0
    for i, (a, b) in enumerate(zip(choices(theirs), choices(mine))):
        if a[:2] != b[:2]:
            print(f"alloc {i}: torch reuses #{a[1]} ({a[2]}), gpumem #{b[1]} ({b[2]})")
            shown += 1
            if shown >= limit:
                break
    if shown == 0:
        print("the same block choices throughout")


if __name__ == "__main__":
    main()
