"""Records, on the GPU machine, PyTorch snapshots that use the newest snapshot fields (issue 42
point 4) and one that ran out of memory in training (the MCP server's "why did this run out of
memory" example).

Usage: python3 record_new_fields.py OUTDIR

OUTDIR/new_fields.pickle: record_function annotations, user_metadata (set and cleared), a CUDA
graph's private pool and a user MemPool (segment_pool_id), compile_context (torch.compile with
the eager backend), allocator settings from PYTORCH_CUDA_ALLOC_CONF, and an out-of-memory
caught. OUTDIR/new_fields_expandable.pickle: the same under expandable segments (run this
script twice, the second time with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True and
NAME=new_fields_expandable). OUTDIR/oom_gpt2.pickle: GPT-2 small training (AdamW, batch 8 x
1,024) with the process limited to 6 GiB by set_per_process_memory_fraction: the OOM and what
held memory then. OUTDIR/new_fields.json: what was done, the figures PyTorch reported.
"""
import json
import os
import sys

import torch

out = sys.argv[1]
os.makedirs(out, exist_ok=True)
M = torch.cuda.memory
name = os.environ.get("NAME", "new_fields")
log = {"torch": torch.__version__, "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF")}

M._record_memory_history("all", context="all", stacks="python", compile_context=True,
                         global_record_annotations=True)
dev = torch.device("cuda")
with torch.profiler.record_function("load"):
    M._set_memory_metadata("phase=load")
    a = torch.randn(1024, 1024, device=dev)
    b = torch.randn(4096, 1024, device=dev)
    M._set_memory_metadata("")
with torch.profiler.record_function("step"):
    with torch.profiler.record_function("inner"):
        c = b @ a
    del b
# a CUDA graph's private pool
s = torch.cuda.Stream()
s.wait_stream(torch.cuda.current_stream())
with torch.cuda.stream(s):
    for _ in range(2):
        y = a * 3 + 1
torch.cuda.current_stream().wait_stream(s)
g = torch.cuda.CUDAGraph()
with torch.cuda.graph(g):
    y = a * 3 + 1
g.replay()
# a user pool
pool = torch.cuda.MemPool()
with torch.cuda.use_mem_pool(pool):
    p = torch.empty(3 << 20, dtype=torch.uint8, device=dev)


def f(x):
    return (x.sin() + x.cos()).sum(0)


z = torch.compile(f, backend="eager")(c)
try:
    torch.empty(1 << 45, dtype=torch.uint8, device=dev)
    log["oom"] = False
except torch.OutOfMemoryError:
    log["oom"] = True
torch.cuda.synchronize()
log["max_memory_allocated"] = torch.cuda.max_memory_allocated()
log["max_memory_reserved"] = torch.cuda.max_memory_reserved()
log["memory_allocated"] = torch.cuda.memory_allocated()
log["memory_reserved"] = torch.cuda.memory_reserved()
M._dump_snapshot(os.path.join(out, name + ".pickle"))
M._record_memory_history(None)
del a, c, y, p, z, g, pool
torch.cuda.empty_cache()

if name == "new_fields":
    # training that runs out: GPT-2 small, AdamW, batch 8 x 1024, in 6 GiB
    import transformers as T

    torch.cuda.reset_peak_memory_stats()
    total = torch.cuda.get_device_properties(0).total_memory
    torch.cuda.set_per_process_memory_fraction((6 << 30) / total)
    torch.manual_seed(0)
    model = T.GPT2LMHeadModel(T.GPT2Config()).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    M._record_memory_history("all", context="all", stacks="python")
    ids = torch.randint(0, 50257, (8, 1024), device=dev)
    oom_at = None
    try:
        for step in range(3):
            loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
    except torch.OutOfMemoryError as e:
        oom_at = str(e).splitlines()[0][:300]
    log["gpt2_oom"] = oom_at
    log["gpt2_max_memory_allocated"] = torch.cuda.max_memory_allocated()
    log["gpt2_max_memory_reserved"] = torch.cuda.max_memory_reserved()
    M._dump_snapshot(os.path.join(out, "oom_gpt2.pickle"))
    M._record_memory_history(None)

json.dump(log, open(os.path.join(out, name + ".json"), "w"), indent=1)
print(json.dumps(log))
