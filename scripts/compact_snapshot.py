"""Turns a PyTorch memory snapshot (pickle from torch.cuda.memory._dump_snapshot) into a small
JSON trace for comparing gpumem's engine with PyTorch op by op: per allocator event its action,
address, size, the ATen op that caused it, the innermost Python frame, and the innermost four
Python frames outside torch.nn's module machinery (where in the modelling code it happened).

Usage: python3 compact_snapshot.py SNAPSHOT.pickle OUT.json   (no torch needed)
"""
import json
import pickle
import sys


def op_of(frames):
    names = [f["name"] for f in frames]
    for n in names:
        if ("at::_ops::" in n or "at::native::" in n) and "empty" not in n and "redispatch" not in n:
            return n.split("(")[0]
    for n in names:
        if "cublas" in n.lower() or "Workspace" in n or "workspace" in n:
            return n.split("(")[0]
    return names[0].split("(")[0] if names else ""


def py_of(frames):
    for f in frames:
        if f["filename"].endswith(".py"):
            return f"{f['filename'].split('/')[-1]}:{f['line']}:{f['name']}"
    return ""


def py_stack(frames):
    out = []
    for f in frames:
        fn = f["filename"]
        if fn.endswith(".py") and "torch/nn/modules/module.py" not in fn and "_contextlib" not in fn:
            out.append(f"{fn.split('/')[-1]}:{f['line']}:{f['name']}")
            if len(out) == 4:
                break
    return out


def main():
    snap = pickle.load(open(sys.argv[1], "rb"))
    events = []
    for e in snap["device_traces"][0]:
        fr = e.get("frames", [])
        events.append([e["action"], e.get("addr", e.get("device_free", 0)), e.get("size", 0), op_of(fr), py_of(fr), py_stack(fr)])
    live = []
    for s in snap["segments"]:
        for b in s["blocks"]:
            if b["state"] != "inactive":
                fr = b.get("frames", [])
                live.append([b["address"], b["size"], b["requested_size"], op_of(fr), py_of(fr)])
    json.dump({"events": events, "live_at_end": live, "allocator_settings": snap.get("allocator_settings")},
              open(sys.argv[2], "w"))


if __name__ == "__main__":
    main()
