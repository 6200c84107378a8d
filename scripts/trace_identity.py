"""Like trace_diff.py, but compares which allocation each free releases (by the allocation's
ordinal), so two frees of same-size tensors in swapped order are found.

Usage: python3 trace_identity.py GPUMEM_SNAPSHOT.json TORCH_TRACE.json[.xz] [--runs-as-sets]
--runs-as-sets compares each run of consecutive frees as a set (PyTorch clears its autocast
cache in hash-map order, which follows host addresses: the frees at a region's exit).
"""
import sys
from trace_diff import load


def seq(events):
    live, n, out = {}, 0, []
    for a, addr, size, where in events:
        if a == "alloc":
            live[addr] = n
            out.append(("alloc", n, size, where))
            n += 1
        elif a == "free_completed":
            out.append(("free", live.pop(addr, -1), size, where))
    return out


def free_runs_sorted(s):
    out, i = [], 0
    while i < len(s):
        j = i
        while j < len(s) and s[j][0] == "free":
            j += 1
        if j > i:
            out.extend(sorted(s[i:j], key=lambda e: e[1]))
            i = j
        else:
            out.append(s[i])
            i += 1
    return out


def main():
    g = load(sys.argv[1])
    stacks = g["stacks"]
    ge = []
    for e in g["trace"]["events"]:
        tags = stacks[e["stack"]] if e.get("stack") is not None else []
        if tags and tags[0] == "setup":
            continue
        ge.append((e["action"], e["addr"], e["size"], " / ".join(x for x in tags if not x.startswith("category:"))))
    t = load(sys.argv[2])
    te = [(e[0], e[1], e[2], f"{e[3][:40]} | {' < '.join(e[5][:2]) if len(e) > 5 else e[4]}") for e in t["events"]]
    gs, ts = seq(ge), seq(te)
    if "--runs-as-sets" in sys.argv:
        gs, ts = free_runs_sorted(gs), free_runs_sorted(ts)
    for i, (x, y) in enumerate(zip(gs, ts)):
        if x[:3] != y[:3]:
            print(f"first difference at event {i}: gpumem {x[:3]} torch {y[:3]}")
            for k in range(max(0, i - 6), min(len(gs), i + 6)):
                print(f"  {k:6} g {gs[k][0]:5} #{gs[k][1]:<6} {gs[k][2]:>10} {gs[k][3][:60]}")
                print(f"  {k:6} t {ts[k][0]:5} #{ts[k][1]:<6} {ts[k][2]:>10} {ts[k][3][:60]}")
            return 1
    print(f"identical identities over {min(len(gs), len(ts))} events")
    return 0


if __name__ == "__main__":
    sys.exit(main())
