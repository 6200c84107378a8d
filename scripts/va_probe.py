"""Records where the CUDA driver places device allocations (cudaMalloc through CuPy's runtime
bindings, in a process whose context PyTorch created, as in a training run): for each probe
sequence of mallocs and frees, in a fresh process, the address each malloc returned. The data
for modelling the driver's virtual-address placement, which breaks the caching allocator's
best-fit ties between equal-size free blocks.

Usage: python3 va_probe.py OUT.json          (runs every probe, each in a child process)
       python3 va_probe.py --one NAME        (one probe; prints its JSON row)
"""
import json
import subprocess
import sys

MIB = 1 << 20

# Each probe: a list of ("m", size) mallocs and ("f", k) frees of the k-th malloc.
def m(*sizes):
    return [("m", s * MIB) for s in sizes]


PROBES = {
    "2x40": m(*[2] * 40),
    "20x20": m(*[20] * 20),
    "alt_2_20": m(*[2, 20] * 15),
    "grow": m(2, 4, 8, 16, 32, 64, 128, 256, 512, 1024),
    "64x10": m(*[64] * 10),
    "32x10": m(*[32] * 10),
    "16x10": m(*[16] * 10),
    "12x10": m(*[12] * 10),
    "mixed": m(32, 20, 2, 16, 16, 20, 2, 16, 16, 20, 20, 16, 16, 20, 2, 16, 16, 20, 64, 64, 64, 64, 2, 2, 2, 2, 32),
    "holes": m(*[20] * 10) + [("f", 2), ("f", 4), ("f", 5)] + m(2, 2, 2, 20, 16, 40, 2),
    "big_then_small": m(512) + m(*[2] * 5) + m(*[20] * 5) + m(64, 2, 64, 2),
    "odd": m(*[26] * 6) + m(*[22] * 6) + m(*[48] * 4) + m(*[192] * 3) + m(2, 2),
}


def one(name):
    import torch
    import cupy

    torch.zeros(1, device="cuda")  # PyTorch's context, as hf_models.py's first tensor makes it
    torch.cuda.synchronize()
    ptrs, rows = [], []
    for op, v in PROBES[name]:
        if op == "m":
            p = cupy.cuda.runtime.malloc(v)
            ptrs.append(p)
            rows.append(["m", v, p])
        else:
            cupy.cuda.runtime.free(ptrs[v])
            rows.append(["f", v, ptrs[v]])
    print(json.dumps({"probe": name, "events": rows}))


def main():
    if sys.argv[1] == "--one":
        one(sys.argv[2])
        return
    out = []
    for name in PROBES:
        for rep in range(2):  # twice: is the driver deterministic?
            r = subprocess.run([sys.executable, __file__, "--one", name], capture_output=True, text=True, timeout=120)
            if r.returncode != 0:
                out.append({"probe": name, "rep": rep, "error": r.stderr[-2000:]})
                continue
            row = json.loads(r.stdout.strip().splitlines()[-1])
            row["rep"] = rep
            out.append(row)
            print(name, rep, " ".join(hex(e[2]) for e in row["events"][:8]), flush=True)
    with open(sys.argv[1], "w") as f:
        json.dump(out, f)


if __name__ == "__main__":
    main()
