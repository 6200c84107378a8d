"""Records, on the GPU machine, the workspace cuDNN's SDPA forward takes from the caching
allocator (the allocation made inside run_cudnn_SDP_fprop) for bf16 shapes under no_grad:
decode steps (one query, not causal, grouped heads) and prefills (causal). Prints and writes
JSON rows {B, H, KV, T, L, D, causal, workspace: [sizes]}.

Usage: python3 sdpa_workspace.py OUT.json
"""
import itertools, json, sys

import torch
import torch.nn.functional as F

dev = "cuda"


def workspace(B, H, KV, T, L, D, causal):
    q = torch.randn(B, H, T, D, device=dev, dtype=torch.bfloat16)
    k = torch.randn(B, KV, L, D, device=dev, dtype=torch.bfloat16)
    v = torch.randn(B, KV, L, D, device=dev, dtype=torch.bfloat16)
    torch.cuda.synchronize()
    torch.cuda.memory._record_memory_history(max_entries=100000, stacks="all")
    with torch.no_grad():
        y = F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=H != KV)
    torch.cuda.synchronize()
    snap = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    sizes, kernel = [], "?"
    for tr in snap["device_traces"]:
        for e in tr:
            if e["action"] != "alloc":
                continue
            names = " ".join(f.get("name", "") for f in e.get("frames", []))
            if "run_cudnn_SDP_fprop" in names:
                sizes.append(e["size"])
            if "cudnn" in names:
                kernel = "cudnn"
            elif kernel == "?" and "efficient" in names:
                kernel = "efficient"
            elif kernel == "?" and "flash" in names:
                kernel = "flash"
    del y, q, k, v
    return sizes, kernel


rows = []
shapes = []
for B, (H, KV), D, L in itertools.product([1, 2, 4, 8, 16], [(8, 2), (16, 4), (32, 8), (32, 32), (16, 16)], [64, 128],
                                          [64, 128, 129, 143, 200, 256, 257, 384, 512, 513, 575, 768, 1024, 2048, 4096, 8192]):
    shapes.append((B, H, KV, 1, L, D, False))
for B, (H, KV), D, T in itertools.product([1, 2, 4, 8], [(8, 2), (16, 4), (32, 8)], [64, 128], [16, 64, 128, 512, 1024, 2048]):
    shapes.append((B, H, KV, T, T, D, True))
for s in shapes:
    try:
        ws, kern = workspace(*s)
    except Exception as e:
        ws, kern = None, repr(e)[:200]
    r = dict(zip(["B", "H", "KV", "T", "L", "D", "causal"], s), workspace=ws, kernel=kern)
    rows.append(r)
    print(json.dumps(r), flush=True)
json.dump({"torch": torch.__version__, "cudnn": torch.backends.cudnn.version(), "rows": rows},
          open(sys.argv[1], "w"), indent=0)
