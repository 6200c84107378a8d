"""Records, on the GPU machine, what PyTorch's SDPA allocates for a decode step (one query)
given an attention mask, in bf16 under no_grad: every allocation made inside the call, with
the kernel that ran (cuDNN, memory-efficient, flash, math) read from the stacks. The mask is
[B, 1, 1, L] as transformers' sliding-window layers pass it past the window: boolean, or an
additive mask in the query's dtype. Keys and values have the query's heads (transformers
repeats them itself when it passes a mask).

Usage: python3 sdpa_mask_workspace.py OUT.json
"""
import itertools
import json
import sys

import torch
import torch.nn.functional as F


def one(batch, heads, keys, width, kind):
    q = torch.randn(batch, heads, 1, width, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(batch, heads, keys, width, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    keep = torch.ones(batch, 1, 1, keys, device="cuda", dtype=torch.bool)
    keep[..., : keys // 7] = False
    if kind == "bool":
        mask = keep
    else:
        mask = torch.zeros(batch, 1, 1, keys, device="cuda", dtype=torch.bfloat16)
        mask.masked_fill_(~keep, float("-inf"))
    torch.cuda.synchronize()
    torch.cuda.memory._record_memory_history(max_entries=100000, stacks="all")
    with torch.no_grad():
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    torch.cuda.synchronize()
    snap = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    allocs, kernel = [], None
    for trace in snap["device_traces"]:
        for e in trace:
            names = " ".join(f.get("name", "") for f in e.get("frames", []))
            for tag in ("cudnn", "efficient", "flash", "math"):
                if kernel is None and tag in names.lower():
                    kernel = tag
            if e["action"] == "alloc":
                allocs.append(e["size"])
    del out
    return allocs, kernel


rows = []
grid = itertools.product([1, 2, 3, 4, 8], [4, 8, 16, 32], [64, 128, 256],
                         [512, 513, 520, 600, 640, 768, 1000, 1024, 1536, 2048, 4096, 8192],
                         ["bf16", "bool"])
for b, h, w, l, kind in grid:
    try:
        allocs, kernel = one(b, h, l, w, kind)
        err = None
    except Exception as e:  # a shape no kernel takes: recorded as such
        allocs, kernel, err = None, None, repr(e)[:160]
    row = dict(B=b, H=h, L=l, D=w, mask=kind, allocs=allocs, kernel=kernel, error=err)
    rows.append(row)
    print(json.dumps(row), flush=True)
json.dump({"torch": torch.__version__, "cudnn": torch.backends.cudnn.version(), "rows": rows},
          open(sys.argv[1], "w"), indent=0)
