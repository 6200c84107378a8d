"""Records further world-size-1 distributed cases on the GPU machine with ../shared/tools/dist1.py
(carried in gpu_carry/): the same loop and output files, with more configurations than dist1.py
lists. Usage: python3 dist_record.py OUTDIR CASE ; python3 dist_record.py --list"""
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
})

if __name__ == "__main__":
    dist1.sys.argv = sys.argv
    if sys.argv[1:2] == ["--list"]:
        print(" ".join(dist1.CASES))
    else:
        dist1.main()
