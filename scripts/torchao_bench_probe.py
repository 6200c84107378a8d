"""Issue 42: when does inductor benchmark torchao's compiled update (the L2-sized buffer it
allocates and frees around each timing) with a warm cache? One optimizer step per parameter
size, in a fresh process, with PyTorch's allocation history; prints, per parameter, the number
of allocations of the L2 cache's size made during its update.

Usage: TORCHINDUCTOR_CACHE_DIR=DIR python3 torchao_bench_probe.py OPT LAST_DIM ROWS...
  OPT: torchao_adamw8bit | torchao_adamw4bit; each parameter is [ROWS*block/LAST_DIM, LAST_DIM].
"""
import json
import sys

import torch
import torchao.optim as O

opt_name, last = sys.argv[1], int(sys.argv[2])
rows = [int(x) for x in sys.argv[3:]]
cls, block = {"torchao_adamw8bit": (O.AdamW8bit, 256), "torchao_adamw4bit": (O.AdamW4bit, 128)}[opt_name]
l2 = torch.cuda.get_device_properties(0).L2_cache_size
out = {"opt": opt_name, "last_dim": last, "l2": l2, "params": []}
for r in rows:
    n = r * block
    p = torch.nn.Parameter(torch.randn(n // last, last, device="cuda"))
    p.grad = torch.randn_like(p)
    o = cls([p], lr=1e-4)
    torch.cuda.synchronize()
    torch.cuda.memory._record_memory_history(max_entries=100000)
    o.step()
    torch.cuda.synchronize()
    snap = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    ev = [e for t in snap["device_traces"] for e in t if e["action"] == "alloc"]
    out["params"].append({"rows": r, "shape": list(p.shape),
                          "l2_allocs": sum(1 for e in ev if e["size"] == l2),
                          "allocs": [e["size"] for e in ev]})
    del o, p
print(json.dumps(out))
