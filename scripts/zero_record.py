"""Records DeepSpeed ZeRO stage 1/2/3 cases on the GPU machine at world size 1 (NCCL, one
process), on ../shared/tools/dist1.py's Llama config, in dist1.py's format: per-iteration
figures, the end's memory_stats, NVML-free driver usage and PyTorch's snapshot with Python
stacks. The optimizer is what `"optimizer": {"type": "AdamW"}` gives: DeepSpeed's FusedAdam on
the device, DeepSpeedCPUAdam with `offload_optimizer.device = "cpu"` (both JIT-built by
DeepSpeed's op builder, so nvcc and ninja must be there).

Usage: python3 zero_record.py OUTDIR CASE ; python3 zero_record.py --list
"""
import json
import os
import pickle
import sys
import time

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(here, "..", "gpu_carry"))

CASES = {
    "zero2_llama_s_adamw_fp32": dict(stage=2, batch=4, seq=1024),
    "zero1_llama_s_adamw_fp32": dict(stage=1, batch=4, seq=1024),
    "zero2_llama_s_b1_s64_fp32": dict(stage=2, batch=1, seq=64),
    "zero2_llama_s_bucket1e7_fp32": dict(stage=2, batch=4, seq=1024, bucket=10_000_000),
    "zero2_llama_s_adamw_bf16": dict(stage=2, batch=4, seq=1024, bf16=True),
    "zero2_llama_s_offload_fp32": dict(stage=2, batch=4, seq=1024, offload=True),
    "zero1_llama_s_offload_fp32": dict(stage=1, batch=4, seq=1024, offload=True),
    "zero2_llama_s_offload_bf16": dict(stage=2, batch=4, seq=1024, offload=True, bf16=True),
    "zero1_llama_s_bucket1e7_bf16": dict(stage=1, batch=2, seq=512, bucket=10_000_000, bf16=True),
    # stage 3: the parameters partitioned too, fetched per submodule (the model built normally,
    # partitioned by deepspeed.initialize, not under zero.Init)
    "zero3_llama_s_adamw_fp32": dict(stage=3, batch=4, seq=1024),
    "zero3_llama_s_adamw_bf16": dict(stage=3, batch=4, seq=1024, bf16=True),
    "zero3_llama_s_b1_s64_fp32": dict(stage=3, batch=1, seq=64),
    # stage 3 with the optimizer offloaded (DeepSpeedCPUAdam), and with the parameters too
    "zero3_llama_s_offload_fp32": dict(stage=3, batch=4, seq=1024, offload=True),
    "zero3_llama_s_offload_bf16": dict(stage=3, batch=4, seq=1024, offload=True, bf16=True),
    "zero3_llama_s_offparam_fp32": dict(stage=3, batch=4, seq=1024, offload=True,
                                        offload_param=True),
}


def main():
    out, name = sys.argv[1], sys.argv[2]
    kw = CASES[name]
    for k, v in dict(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                     MASTER_PORT="29531").items():
        os.environ.setdefault(k, v)
    import torch
    import deepspeed
    import transformers as T
    import dist1

    torch.cuda.set_device(0)
    deepspeed.init_distributed(dist_backend="nccl")
    torch.manual_seed(0)
    cfg = T.LlamaConfig(**dist1.LLAMA_S)
    cfg._attn_implementation = "sdpa"
    base = torch.cuda.memory_allocated()
    model = T.LlamaForCausalLM(cfg)
    zero = {"stage": kw["stage"]}
    if "bucket" in kw:
        zero["reduce_bucket_size"] = kw["bucket"]
    if kw.get("offload"):
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
    if kw.get("offload_param"):
        zero["offload_param"] = {"device": "cpu", "pin_memory": True}
    ds = {
        "train_micro_batch_size_per_gpu": kw["batch"],
        "gradient_accumulation_steps": 1,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}},
        "zero_optimization": zero,
        "steps_per_print": 1_000_000,
    }
    if kw.get("bf16"):
        ds["bf16"] = {"enabled": True}
    # stage 3 (or RECORD_INIT=1): the snapshot's history starts before deepspeed.initialize,
    # so the partitioning is in it (nothing is on the device yet)
    from_init = kw["stage"] == 3 or bool(os.environ.get("RECORD_INIT"))
    if from_init:
        torch.cuda.memory._record_memory_history(max_entries=1_000_000, stacks="python")
    engine, opt, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=ds)
    torch.cuda.synchronize()
    after_model = torch.cuda.memory_allocated()
    after_model_reserved = torch.cuda.memory_reserved()
    if not from_init:
        torch.cuda.memory._record_memory_history(max_entries=1_000_000, stacks="python")
    rows = []
    for it in range(3):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        t = time.time()
        r = {"iter": it, "start": torch.cuda.memory_allocated()}
        x = torch.randint(0, 32000, (kw["batch"], kw["seq"]), device="cuda")
        out_ = engine(input_ids=x, labels=x)
        r["after_forward"] = torch.cuda.memory_allocated()
        engine.backward(out_.loss)
        r["after_backward"] = torch.cuda.memory_allocated()
        r["loss"] = float(out_.loss)
        del out_, x
        engine.step()
        r["after_step"] = torch.cuda.memory_allocated()
        torch.cuda.synchronize()
        r["seconds"] = time.time() - t
        r["end"] = torch.cuda.memory_allocated()
        r["peak_allocated"] = torch.cuda.max_memory_allocated()
        r["peak_reserved"] = torch.cuda.max_memory_reserved()
        r["reserved_end"] = torch.cuda.memory_reserved()
        rows.append(r)
    snap = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    pickle.dump(snap, open(os.path.join(out, f"snapshot_{name}.pickle"), "wb"))
    free, total = torch.cuda.mem_get_info()
    res = {"name": name, "config": kw, "model": dist1.LLAMA_S, "base_allocated": base,
           "after_model_allocated": after_model, "after_model_reserved": after_model_reserved,
           "history_from_init": from_init, "iterations": rows,
           "memory_stats_end": dict(torch.cuda.memory_stats()), "driver_used_bytes_end": total - free,
           "deepspeed": deepspeed.__version__, "optimizer": type(engine.optimizer).__name__,
           "basic_optimizer": type(getattr(engine, "basic_optimizer", None)).__name__,
           "ds_config": ds}
    json.dump({"torch_version": torch.__version__, "world_size": 1, "cases": [res]},
              open(os.path.join(out, f"zero_{name}.json"), "w"), indent=1)
    print(name, res["optimizer"], res["basic_optimizer"],
          [(r["peak_allocated"], r["peak_reserved"]) for r in rows], "driver_used", total - free, flush=True)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--list"]:
        print(" ".join(CASES))
    else:
        main()
