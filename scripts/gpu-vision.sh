#!/bin/bash
# torchvision ResNet on the GPU machine, in one call (issue: vision models):
#  1. scripts/conv_workspace.py: cuDNN convolution's allocations (forward, backward-data,
#     backward-weight workspaces) over the resnet family's convs and a generic grid -> conv_workspace.jsonl
#  2. in parallel, held-out whole-model cases with scripts/gpu-hf-traces.sh (STACKS=all), which
#     needs the carried .gpu/hf_models.py (../shared/tools/hf_models.py with stacks from $STACKS).
# The two run at once on the one GPU: each process has its own caching allocator, and cuDNN's
# heuristic plan choice (benchmark off) does not look at free memory, so neither disturbs the
# other's allocations (only their timings).
# Usage (device call): bash scripts/gpu-vision.sh   [SWEEP_BUDGET=s CASE_BUDGET=s]
set -u
O=${OUT:-/tmp/gpumem-out}
mkdir -p "$O"
export PYTHONUNBUFFERED=1
python3 -c "import torch, torchvision; print('torch', torch.__version__, 'torchvision', torchvision.__version__, 'cudnn', torch.backends.cudnn.version(), torch.cuda.get_device_name(0))"
( timeout ${CASE_TIMEOUT:-470} env BUDGET=${CASE_BUDGET:-250} bash scripts/gpu-hf-traces.sh \
    'resnet50_b16_sgdm_fp32="family": "resnet50", "batch": 16, "opt": "sgd_momentum"' \
    'resnet18_b32_sgdm_fp32="family": "resnet18", "batch": 32, "opt": "sgd_momentum"' \
    'resnet34_b8_adamw_fp32="family": "resnet34", "batch": 8, "opt": "adamw"' \
    'resnet101_b4_sgdm_fp32="family": "resnet101", "batch": 4, "opt": "sgd_momentum"' \
    > "$O/cases.log" 2>&1 ) &
CP=$!
timeout ${SWEEP_TIMEOUT:-440} python3 scripts/conv_workspace.py "$O/conv_workspace.jsonl" --budget ${SWEEP_BUDGET:-330} > "$O/sweep.log" 2>&1
echo "sweep rc $?"
wait $CP
echo "cases rc $?"
rm -rf "$O"/hf "$O"/raw_*
xz -6 "$O/conv_workspace.jsonl"
ls -la "$O"
grep -v "^     \|^  alloc" "$O/sweep.log" | tail -25
cat "$O/cases.log"
