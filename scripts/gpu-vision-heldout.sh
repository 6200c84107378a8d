#!/bin/bash
# Issue 14's second vision call on the GPU machine:
#  1. further held-out torchvision cases with their traces (scripts/gpu-hf-traces.sh, STACKS=all):
#     grouped convolutions (resnext50_32x4d), wide_resnet50_2, resnet152, a batch the conv sweep
#     did not measure (resnet50 at 24), resnet18 with AdamW at 64;
#  2. the driver's address placement: scripts/va_probe.py (raw cudaMalloc sequences, each twice in
#     a fresh process), and two model cases recorded from the process start (FULLHIST=1: the
#     setup's segments with their addresses too).
# Needs the carried .gpu/hf_models.py (gpu-hf-traces.sh says which copy).
set -u
O=${OUT:-/tmp/gpumem-out}
mkdir -p "$O"
export PYTHONUNBUFFERED=1
t0=$(date +%s)
BUDGET=${CASE_BUDGET:-240} bash scripts/gpu-hf-traces.sh \
  'resnext50_b8_sgdm_fp32="family": "resnext50_32x4d", "batch": 8, "opt": "sgd_momentum"' \
  'resnet50_b24_sgdm_fp32="family": "resnet50", "batch": 24, "opt": "sgd_momentum"' \
  'wide_resnet50_b4_adamw_fp32="family": "wide_resnet50_2", "batch": 4, "opt": "adamw"' \
  'resnet152_b2_sgdm_fp32="family": "resnet152", "batch": 2, "opt": "sgd_momentum"' \
  'resnet18_b64_adamw_fp32="family": "resnet18", "batch": 64, "opt": "adamw"' > "$O/cases.log" 2>&1
echo "vision cases: $(( $(date +%s) - t0 )) s"; cat "$O/cases.log"
mv "$O/hf_traces.tgz" "$O/vision_traces.tgz" 2>/dev/null
t0=$(date +%s)
timeout 150 python3 scripts/va_probe.py "$O/va_probe.json" > "$O/va_probe.log" 2>&1
echo "va probe rc $? in $(( $(date +%s) - t0 )) s"; tail -30 "$O/va_probe.log"
LT='"vocab_size": 16000, "hidden_size": 512, "intermediate_size": 1408, "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 2, "max_position_embeddings": 2048'
FULLHIST=1 BUDGET=120 bash scripts/gpu-hf-traces.sh \
  "llama_t_sdpa_adamw_fp32=\"family\": \"llama\", \"cfg\": {$LT}, \"attn\": \"sdpa\", \"batch\": 2, \"seq\": 512, \"opt\": \"adamw\"" \
  "llama_s_generate_bf16" > "$O/fullhist.log" 2>&1
cat "$O/fullhist.log"
mv "$O/hf_traces.tgz" "$O/fullhist_traces.tgz" 2>/dev/null
rm -rf "$O"/hf "$O"/raw_*
ls -la "$O"
