"""Records DDP and FSDP2 cases on the GPU machine: every rank's per-iteration figures, its
snapshot with Python stacks and NVML's used memory, at any world size (one process per GPU
under torchrun; NCCL; NVLink multicast off as the GPU tool's notes require). The cases are
../shared/tools/dist1.py's (carried in gpu_carry/) and more; at world size 1 without torchrun
dist1.py's own loop runs, so its records compare with ../shared/groundtruth/dist1.

Usage:
  python3 dist_record.py OUTDIR CASE                     (world size 1, dist1.py's loop)
  torchrun --nproc-per-node N dist_record.py OUTDIR CASE (every rank: dist1_CASE_wN_rR.json,
                                                          snapshot_CASE_wN_rR.pickle)
  python3 dist_record.py --list
"""
import os
import sys

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(here, "..", "gpu_carry"))
import dist1  # noqa: E402

dist1.CASES.update({
    # DDP with the gradients as views into the buckets (no copy into the bucket, no bucket copy back)
    "ddp_llama_s_adamw_fp32_bucketview": dict(wrap="ddp", batch=4, seq=1024, bucket_view=True),
    # another shape: fewer tokens, so the activations no longer dominate
    "ddp_llama_s_b2_s256_adamw_fp32": dict(wrap="ddp", batch=2, seq=256),
    # FSDP2 without mixed precision and without offload
    "fsdp2_llama_s_adamw_fp32": dict(wrap="fsdp2", batch=4, seq=1024),
    # FSDP2 keeping the unsharded parameters after forward
    "fsdp2_llama_s_adamw_bf16mp_noreshard": dict(wrap="fsdp2", batch=4, seq=1024, mp=True, reshard=False),
    "fsdp2_llama_s_adamw_fp32_noreshard": dict(wrap="fsdp2", batch=4, seq=1024, reshard=False),
    # HF gradient checkpointing (use_reentrant=False, as hf_models.py enables it) under each
    # strategy: checkpointing is switched on before the model is wrapped
    "ddp_llama_s_adamw_fp32_ckpt": dict(wrap="ddp", batch=4, seq=1024, ckpt=True),
    "fsdp2_llama_s_adamw_fp32_ckpt": dict(wrap="fsdp2", batch=4, seq=1024, ckpt=True),
    "fsdp2_llama_s_adamw_bf16mp_ckpt": dict(wrap="fsdp2", batch=4, seq=1024, mp=True, ckpt=True),
    "fsdp2_llama_s_adamw_bf16mp_noreshard_ckpt": dict(wrap="fsdp2", batch=4, seq=1024, mp=True,
                                                      reshard=False, ckpt=True),
    "fsdp2_llama_s_adamw_bf16mp_offload_ckpt": dict(wrap="fsdp2", batch=4, seq=1024, mp=True,
                                                    offload=True, ckpt=True),
    # the weights themselves in bf16 (the model converted before it is wrapped; no mixed
    # precision policy: FSDP2 gathers and reduces in bf16, AdamW's states are bf16)
    "ddp_llama_s_adamw_bf16w": dict(wrap="ddp", batch=4, seq=1024, bf16w=True),
    "fsdp2_llama_s_adamw_bf16w": dict(wrap="fsdp2", batch=4, seq=1024, bf16w=True),
    # peft's LoRA as ../shared/tools/hf_models.py makes it (r 16, alpha 32, dropout 0.05 on
    # q_proj and v_proj, the base frozen; adapters over bf16 weights upcast to float32 as
    # get_peft_model does), injected at the end of the constructor so that the strategy wraps
    # LlamaForCausalLM itself (layers and root, as dist1.py does)
    "ddp_llama_s_lora_fp32": dict(wrap="ddp", batch=4, seq=1024, lora=True),
    "fsdp2_llama_s_lora_fp32": dict(wrap="fsdp2", batch=4, seq=1024, lora=True),
    "fsdp2_llama_s_lora_bf16mp": dict(wrap="fsdp2", batch=4, seq=1024, lora=True, mp=True),
    "fsdp2_llama_s_lora_bf16w": dict(wrap="fsdp2", batch=4, seq=1024, lora=True, bf16w=True),
    "fsdp2_llama_s_lora_fp32_ckpt": dict(wrap="fsdp2", batch=4, seq=1024, lora=True, ckpt=True),
    # float32 parameters, the forward (and the loss inside it) under bf16 autocast, as a loop
    # with `with torch.autocast("cuda", torch.bfloat16): loss = model(...)` runs it
    "ddp_llama_s_adamw_amp_bf16": dict(wrap="ddp", batch=4, seq=1024, amp=True),
    "fsdp2_llama_s_adamw_amp_bf16": dict(wrap="fsdp2", batch=4, seq=1024, amp=True),
})


def with_model_patch(name):
    """dist1.py builds `transformers.LlamaForCausalLM(cfg)` itself: for a case with `ckpt`,
    every LlamaForCausalLM built from here on has HF gradient checkpointing on
    (use_reentrant=False), and for one with `bf16w` its weights in bf16, both done at the end
    of its constructor (before the strategy wraps it); `lora` injects peft's adapters after
    `model.cuda()` (as get_peft_model on a model on the device), and `amp` runs
    LlamaForCausalLM's forward under bf16 autocast. It prints what it did, so that a record
    whose layers do not checkpoint is not taken for a ckpt case."""
    kw = dist1.CASES.get(name, {})
    if not (kw.get("ckpt") or kw.get("bf16w") or kw.get("lora") or kw.get("amp")):
        return
    from transformers.models.llama import modeling_llama as ML
    init = ML.LlamaForCausalLM.__init__
    torch = dist1.torch

    if kw.get("amp"):
        forward = ML.LlamaForCausalLM.forward

        def forward_amp(self, *a, **k):
            with torch.autocast("cuda", dtype=torch.bfloat16):
                return forward(self, *a, **k)

        ML.LlamaForCausalLM.forward = forward_amp

    def lora(model):
        # get_peft_model's order: the adapters made on the base weights' device once the
        # model is there, in its dtype, then (autocast_adapter_dtype) upcast one by one
        from peft import LoraConfig, inject_adapter_in_model
        inject_adapter_in_model(LoraConfig(r=16, lora_alpha=32, lora_dropout=0.05,
                                           target_modules=["q_proj", "v_proj"]), model)
        for n, p in model.named_parameters():
            p.requires_grad_("lora_" in n)
            if "lora_" in n and p.dtype != torch.float32:
                p.data = p.data.float()
        trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
        print(f"{name}: LoRA, {trainable} trainable parameters, adapters "
              f"{[p.dtype for n, p in model.named_parameters() if 'lora_' in n][0]} "
              f"on {next(model.parameters()).device}", flush=True)

    if kw.get("lora"):
        if kw.get("offload") or "WORLD_SIZE" in os.environ:
            raise SystemExit(f"{name}: LoRA is injected after `model.cuda()` (dist1.py's "
                             "world-size-1 loop without offload) only")
        cuda = ML.LlamaForCausalLM.cuda

        def cuda_patched(self, *a, **k):
            model = cuda(self, *a, **k)
            lora(model)
            return model

        ML.LlamaForCausalLM.cuda = cuda_patched

    def init_patched(self, *a, **k):
        init(self, *a, **k)
        if kw.get("bf16w"):
            self.to(torch.bfloat16)
        if kw.get("ckpt"):
            # (HF checkpoints only in training mode: said so rather than left to the default)
            self.train()
            self.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        on = sum(bool(getattr(l, "gradient_checkpointing", False)) for l in self.model.layers)
        if kw.get("amp"):
            print(f"{name}: the forward under bf16 autocast", flush=True)
        print(f"{name}: gradient checkpointing on {on} of {len(self.model.layers)} layers, "
              f"training={self.training}, weights {next(self.parameters()).dtype}", flush=True)

    ML.LlamaForCausalLM.__init__ = init_patched


def any_world(out, name):
    """One rank of a torchrun job: dist1.py's loop with this rank's device and the job's world
    size, the model built on the meta device for FSDP2 (to_empty after sharding, as large
    models are) and on the device for DDP."""
    import json
    import pickle
    import time
    import torch
    import torch.distributed as dist
    import transformers as T

    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
    os.environ.setdefault("NVSHMEM_DISABLE_NVLS", "1")
    kw = dist1.CASES[name]
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local = int(os.environ.get("LOCAL_RANK", rank))
    torch.cuda.set_device(local)
    dev = torch.device("cuda", local)
    dist.init_process_group("nccl", rank=rank, world_size=world, device_id=dev)
    torch.manual_seed(0)
    cfg = T.LlamaConfig(**dist1.LLAMA_S)
    cfg._attn_implementation = "sdpa"
    base = torch.cuda.memory_allocated()
    if kw["wrap"] == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP
        model = DDP(T.LlamaForCausalLM(cfg).to(dev), device_ids=[local],
                    gradient_as_bucket_view=kw.get("bucket_view", False))
    else:
        from torch.distributed.fsdp import fully_shard, MixedPrecisionPolicy, CPUOffloadPolicy, OffloadPolicy
        mpp = (MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
               if kw.get("mp") else MixedPrecisionPolicy())
        off = CPUOffloadPolicy(pin_memory=True) if kw.get("offload") else OffloadPolicy()
        with torch.device("meta"):
            model = T.LlamaForCausalLM(cfg)
        for layer in model.model.layers:
            fully_shard(layer, mp_policy=mpp, reshard_after_forward=kw.get("reshard", True), offload_policy=off)
        fully_shard(model, mp_policy=mpp, reshard_after_forward=kw.get("reshard", True), offload_policy=off)
        model.to_empty(device="cpu" if kw.get("offload") else dev)
        model.model.rotary_emb.inv_freq = model.model.rotary_emb.inv_freq.to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)
    torch.cuda.synchronize()
    after_model = torch.cuda.memory_allocated()
    torch.cuda.memory._record_memory_history(max_entries=1_000_000, stacks="python")
    rows = []
    for it in range(3):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        t = time.time()
        r = {"iter": it, "start": torch.cuda.memory_allocated()}
        x = torch.randint(0, dist1.LLAMA_S["vocab_size"], (kw["batch"], kw["seq"]), device=dev)
        out_ = model(input_ids=x, labels=x)
        r["after_forward"] = torch.cuda.memory_allocated()
        out_.loss.backward()
        r["after_backward"] = torch.cuda.memory_allocated()
        del out_, x
        opt.step()
        r["after_step"] = torch.cuda.memory_allocated()
        opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        r["seconds"] = time.time() - t
        r["end"] = torch.cuda.memory_allocated()
        r["peak_allocated"] = torch.cuda.max_memory_allocated()
        r["peak_reserved"] = torch.cuda.max_memory_reserved()
        r["reserved_end"] = torch.cuda.memory_reserved()
        rows.append(r)
    snap = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    tag = f"{name}_w{world}_r{rank}"
    with open(os.path.join(out, f"snapshot_{tag}.pickle"), "wb") as f:
        pickle.dump(snap, f)
    free, total = torch.cuda.mem_get_info()
    nvml = None
    try:
        import pynvml
        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(local)
        for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h):
            if p.pid == os.getpid():
                nvml = p.usedGpuMemory
    except Exception as e:  # the figure is optional: mem_get_info stands in
        nvml = f"unavailable: {e}"
    res = {"name": name, "config": kw, "model": dist1.LLAMA_S, "rank": rank, "world_size": world,
           "base_allocated": base, "after_model_allocated": after_model, "iterations": rows,
           "memory_stats_end": dict(torch.cuda.memory_stats()), "driver_used_bytes_end": total - free,
           "nvml_process_used_end": nvml}
    with open(os.path.join(out, f"dist1_{tag}.json"), "w") as f:
        json.dump({"torch_version": torch.__version__, "world_size": world, "cases": [res]}, f, indent=1)
    print(tag, [(r["peak_allocated"], r["peak_reserved"]) for r in rows], "driver_used", total - free, flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    dist1.sys.argv = sys.argv
    if sys.argv[1:2] == ["--list"]:
        print(" ".join(dist1.CASES))
    elif "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        with_model_patch(sys.argv[2])
        any_world(sys.argv[1], sys.argv[2])
    else:
        with_model_patch(sys.argv[2])
        dist1.main()
