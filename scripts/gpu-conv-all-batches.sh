#!/bin/bash
# The second cuDNN sweep (issue 14): every ResNet/ResNeXt convolution at 224 at every batch 1..128
# that the first sweep did not measure, float32 then bf16 (scripts/conv_workspace.py
# --all-batches), so a ResNet at any batch up to 128 reads measured workspaces.
set -u
O=${OUT:-/tmp/gpumem-out}
mkdir -p "$O"
export PYTHONUNBUFFERED=1
timeout 420 python3 scripts/conv_workspace.py "$O/conv_all_batches.jsonl" --all-batches --budget ${SWEEP_BUDGET:-330} > "$O/sweep.log" 2>&1
echo "sweep rc $?"
xz -6 "$O/conv_all_batches.jsonl"
grep -v "^     \|^  alloc" "$O/sweep.log" | tail -8
ls -la "$O"
