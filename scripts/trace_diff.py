"""Compares gpumem's allocator events with PyTorch's, event by event, and shows the first place
they part: the tool for matching a model op by op (issue 14).

Usage: python3 trace_diff.py GPUMEM_SNAPSHOT.json TORCH_TRACE.json[.xz] [--context N] [--all]
  GPUMEM_SNAPSHOT.json: `gpumem run W --snapshot FILE` (its setup events are skipped: PyTorch's
                        trace starts after the model is built)
  TORCH_TRACE.json:     scripts/compact_snapshot.py's output (fixtures/hf/traces/*.json.xz)
Compares the sequence of (alloc | free, requested size); segment events are shown, not compared.
--all lists every difference in order (alignment resumes after each, one event skipped).
"""
import json
import lzma
import sys


def load(path):
    opener = lzma.open if path.endswith(".xz") else open
    with opener(path, "rt") as f:
        return json.load(f)


def gpumem_events(snap):
    stacks = snap["stacks"]
    out = []
    for e in snap["trace"]["events"]:
        a = e["action"]
        if a not in ("alloc", "free_completed", "segment_alloc", "segment_free"):
            continue
        tags = stacks[e["stack"]] if e.get("stack") is not None and e["stack"] < len(stacks) else []
        if tags and tags[0] == "setup":
            continue
        out.append((a, e["size"], " / ".join(t for t in tags if not t.startswith("category:"))))
    return out


def torch_events(trace):
    out = []
    for e in trace["events"]:
        a = e[0]
        if a not in ("alloc", "free_completed", "segment_alloc", "segment_free"):
            continue
        where = " < ".join(e[5][:3]) if len(e) > 5 else e[4]
        out.append((a, e[2], f"{e[3][:48]} | {where}"))
    return out


def compared(events):
    return [(i, e) for i, e in enumerate(events) if e[0] in ("alloc", "free_completed")]


def show(label, events, at, n):
    print(f"--- {label}")
    for i in range(max(0, at - n), min(len(events), at + n)):
        a, size, where = events[i]
        mark = ">>" if i == at else "  "
        print(f"{mark}{i:6} {a[:7]:7} {size:>11} {where[:150]}")


def main():
    args = sys.argv[1:]
    n = 12
    if "--context" in args:
        k = args.index("--context")
        n = int(args[k + 1])
        del args[k:k + 2]
    every = "--all" in args
    args = [a for a in args if a != "--all"]
    g = gpumem_events(load(args[0]))
    t = torch_events(load(args[1]))
    gc, tc = compared(g), compared(t)
    i = j = 0
    diffs = 0
    while i < len(gc) and j < len(tc):
        (gi, ge), (ti, te) = gc[i], tc[j]
        if ge[0] == te[0] and ge[1] == te[1]:
            i += 1
            j += 1
            continue
        diffs += 1
        if diffs == 1 or every:
            print(f"difference {diffs}: after {i} matching events (gpumem {ge[0]} {ge[1]}, torch {te[0]} {te[1]})")
            if diffs == 1:
                show("gpumem", g, gi, n)
                show("torch", t, ti, n)
            else:
                print(f"    gpumem {gi}: {ge[2][:100]}\n    torch  {ti}: {te[2][:100]}")
        if not every:
            break
        i += 1
        j += 1
    if diffs == 0:
        print(f"identical over {min(len(gc), len(tc))} events (gpumem {len(gc)}, torch {len(tc)})")
    return 1 if diffs else 0


if __name__ == "__main__":
    sys.exit(main())
