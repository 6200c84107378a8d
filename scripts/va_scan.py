"""Maps the free device address space of a real training process at a chosen point, for
modelling where the CUDA driver places the caching allocator's segments (issue 38, point 4:
best-fit ties between equal-size blocks go to the lower address, so the driver's placement
decides them).

A case of ../shared/tools/hf_models.py (carried as gpu_carry/hf_models.py) runs in a fresh
process until its STOP-th call of `torch.cuda.memory_allocated()` (1: before the model, 2: after
`model.to(device)`, 3: first iteration's start, 4: after its forward, 5: after its backward,
6: after its step, 7: its end, 8: the second iteration's start, ...). There the process records
PyTorch's segments (address, size), then maps the free space by asking the driver directly
(CuPy's `cudaMalloc`, outside PyTorch's allocator) for PROBES blocks of 2 MiB: the driver gives
the lowest free address first, so the addresses show the free holes in order, until the holes
run out and it reserves new ranges. The probes disturb what comes after, so the process exits
there; each stop point is its own process (the driver's placement repeats from run to run).

VA_STACK=N sets the per-thread stack limit (cudaLimitStackSize) to N bytes at the first stop
point, before the model; each row records the limit in force at its stop (`stack_limit`).

Usage: python3 va_scan.py OUT.json CASE STOP [STOP...]     (CASE: a name of hf_models.py or
       a JSON case as hf_models.py's --case-json takes; one child process per STOP)
       python3 va_scan.py --one CASE STOP PROBES          (one point; prints a JSON row)
"""
import json
import os
import subprocess
import sys

MIB = 1 << 20


def one(case, stop, probes):
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "gpu_carry"))
    import torch
    import hf_models

    if case.startswith("{"):
        kw = json.loads(case)
        name = kw.pop("name")
    else:
        name, kw = case, hf_models.CASES[case]
    calls = [0]
    real = torch.cuda.memory_allocated

    stack = os.environ.get("VA_STACK")

    def counted(*a, **k):
        calls[0] += 1
        if calls[0] == 1 and stack:
            # VA_STACK=N: the per-thread stack (local memory) limit set to N bytes before the
            # model: the driver re-reserves the context's local memory there and frees the old
            # reservation, if that is the free area later found in the first forward
            import cupy

            torch.cuda.synchronize()
            cupy.cuda.runtime.deviceSetLimit(0, int(stack))
        v = real(*a, **k)
        if calls[0] == stop:
            scan(name, stop, v)
        return v

    torch.cuda.memory_allocated = counted
    hf_models.torch.cuda.memory_allocated = counted

    def scan(name, stop, allocated):
        import cupy

        torch.cuda.synchronize()
        segs = [[s["address"], s["total_size"], s["segment_type"]] for s in torch.cuda.memory_snapshot()]
        got = []
        for _ in range(probes):
            got.append(cupy.cuda.runtime.malloc(2 * MIB))
        for p in got:
            cupy.cuda.runtime.free(p)
        free, total = torch.cuda.mem_get_info()
        # the per-thread stack limit then (cudaLimitStackSize): the driver raises it when a
        # kernel needs more, re-reserving the context's local memory
        limit = cupy.cuda.runtime.deviceGetLimit(0)
        print(json.dumps({"case": name, "stop": stop, "allocated": allocated, "segments": segs,
                          "probes": got, "driver_used": total - free,
                          "stack_limit": limit, "stack_set": stack}), flush=True)
        os._exit(0)

    hf_models.run_case(name, kw, "/tmp", snapshot=False)
    print(json.dumps({"case": name, "stop": stop, "error": "the case ended before the stop point"}))


def main():
    if sys.argv[1] == "--one":
        one(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
        return
    out, case, stops = sys.argv[1], sys.argv[2], [int(s) for s in sys.argv[3:]]
    probes = int(os.environ.get("PROBES", "300"))
    rows = []
    for stop in stops:
        r = subprocess.run([sys.executable, __file__, "--one", case, str(stop), str(probes)],
                           capture_output=True, text=True, timeout=300)
        lines = [l for l in r.stdout.splitlines() if l.startswith("{")]
        row = json.loads(lines[-1]) if lines else {"stop": stop, "error": r.stderr[-2000:]}
        rows.append(row)
        print(stop, row.get("error", "")[-300:] or "%d segments, %d probes" % (len(row["segments"]), len(row["probes"])), flush=True)
        with open(out, "w") as f:  # after every point: a run cut short keeps what it has
            json.dump(rows, f)


if __name__ == "__main__":
    main()
