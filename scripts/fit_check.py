"""On the GPU machine: does PyTorch fit where `gpumem fit` says it does?

Runs one case of reference_models.py (a GPT-2 small sdpa AdamW loop) with a given batch and
options in this process, with the caching allocator allowed `ALLOWED` bytes
(torch.cuda.set_per_process_memory_fraction), which is what gpumem's `--capacity C` gives the
allocator (C less the 518 MiB CUDA context). Prints one JSON line: fits, or the OOM message.

    python3 fit_check.py gpt BATCH [amp] [ckpt] [sgd]     # the GPT-2 small preset
    python3 fit_check.py frag                             # fixtures/workloads/fragmentation_oom.toml
PYTORCH_CUDA_ALLOC_CONF is taken from the environment as PyTorch always does.
"""
import json, os, sys

import torch

allowed = int(os.environ["ALLOWED"])
total = torch.cuda.get_device_properties(0).total_memory
torch.cuda.set_per_process_memory_fraction(allowed / total)
conf = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")
out = {"args": sys.argv[1:], "conf": conf, "allowed": allowed}

if sys.argv[1] == "frag":
    f32 = torch.float32
    try:
        a, b, c = (torch.empty(268435456, dtype=f32, device="cuda") for _ in range(3))
        del a, b, c
        t = [torch.empty(67108864, dtype=f32, device="cuda") for _ in range(12)]
        for i in (0, 2, 4, 6, 8, 10):
            t[i] = None
        huge = torch.empty(201326592, dtype=f32, device="cuda")
        out["fits"] = True
    except torch.OutOfMemoryError as e:
        out["fits"] = False
        out["message"] = str(e)
    out["allocated"] = torch.cuda.memory_allocated()
    out["reserved"] = torch.cuda.memory_reserved()
    out["peak_allocated"] = torch.cuda.max_memory_allocated()
    out["peak_reserved"] = torch.cuda.max_memory_reserved()
else:
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import reference_models as rm

    kw = dict(rm.CASES["gpt2s_b8_sdpa_adamw"])
    kw["batch"] = int(sys.argv[2])
    for flag in sys.argv[3:]:
        if flag == "amp":
            kw["amp"] = "bf16"
        elif flag == "ckpt":
            kw["ckpt"] = True
        elif flag == "sgd":
            kw["opt"] = "sgd"
    try:
        r = rm.run_case("fit", kw, "/tmp")
        out["fits"] = True
        out["peak_allocated"] = max(i["peak_allocated"] for i in r["iterations"])
        out["peak_reserved"] = max(i["peak_reserved"] for i in r["iterations"])
    except torch.OutOfMemoryError as e:
        out["fits"] = False
        out["message"] = str(e)
print(json.dumps(out), flush=True)
