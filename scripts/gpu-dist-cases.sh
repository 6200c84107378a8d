#!/bin/bash
# Issue 39: records world-size-1 DDP and FSDP2 cases on the H200, one fresh process each
# (scripts/dist_record.py over ../shared/tools/dist1.py carried in gpu_carry/).
# Output: $OUT/dist.tar.xz (dist1_NAME.json, snapshot_NAME.pickle.xz).
set -u
D=$(mktemp -d)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
port=29600
for c in ${CASES:-ddp_llama_s_adamw_fp32_bucketview ddp_llama_s_b2_s256_adamw_fp32 fsdp2_llama_s_adamw_fp32 fsdp2_llama_s_adamw_bf16mp_noreshard fsdp2_llama_s_adamw_bf16mp_offload fsdp2_llama_s_adamw_fp32_noreshard}; do
  port=$((port + 1))
  MASTER_PORT=$port timeout 200 python3 scripts/dist_record.py "$D" "$c" 2>&1 | grep -v Warning | tail -3
done
for f in "$D"/snapshot_*.pickle; do xz -6 -T0 "$f"; done
ls -la "$D" | tail -n +2 | awk '{print $5, $9}'
tar -C "$D" -cJf "$OUT/dist.tar.xz" .
