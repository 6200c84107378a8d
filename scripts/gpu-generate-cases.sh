#!/bin/bash
# Issue 14's generation call on the GPU machine: cuDNN SDPA's forward workspace over decode and
# prefill shapes (scripts/sdpa_workspace.py), then further generate cases recorded with traces
# (scripts/gpu-hf-traces.sh). Needs (carried) .gpu/hf_models.py as gpu-hf-traces.sh says.
set -u
O=${OUT:-/tmp/gpumem-out}
mkdir -p "$O"
t0=$(date +%s)
timeout 200 python3 scripts/sdpa_workspace.py "$O/sdpa_workspace.json" > "$O/sdpa_workspace.log" 2>&1
echo "sdpa sweep: $(( $(date +%s) - t0 )) s, $(wc -l < "$O/sdpa_workspace.log") lines"
LT='"vocab_size": 16000, "hidden_size": 512, "intermediate_size": 1408, "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 2, "max_position_embeddings": 2048'
BUDGET=${BUDGET:-330} bash scripts/gpu-hf-traces.sh \
 "llama_t_generate_fp32=\"family\": \"llama\", \"cfg\": {$LT}, \"attn\": \"sdpa\", \"batch\": 2, \"seq\": 128, \"generate\": 16" \
 "llama_t_generate_b1_bf16=\"family\": \"llama\", \"cfg\": {$LT}, \"attn\": \"sdpa\", \"batch\": 1, \"seq\": 200, \"weights\": \"bf16\", \"generate\": 24" \
 "qwen2_t_generate_bf16=\"family\": \"qwen2\", \"cfg\": {$LT}, \"attn\": \"sdpa\", \"batch\": 3, \"seq\": 96, \"weights\": \"bf16\", \"generate\": 12" \
 "llama_v128k_generate_bf16=\"family\": \"llama\", \"cfg\": {\"vocab_size\": 128256, \"hidden_size\": 512, \"intermediate_size\": 1408, \"num_hidden_layers\": 2, \"num_attention_heads\": 8, \"num_key_value_heads\": 2, \"bos_token_id\": 128000, \"eos_token_id\": [128001, 128008, 128009]}, \"attn\": \"sdpa\", \"batch\": 8, \"seq\": 64, \"weights\": \"bf16\", \"generate\": 8" \
 "llama_m_generate_bf16=\"family\": \"llama\", \"cfg\": {\"vocab_size\": 32000, \"hidden_size\": 2048, \"intermediate_size\": 5632, \"num_hidden_layers\": 2, \"num_attention_heads\": 16, \"num_key_value_heads\": 8, \"head_dim\": 128}, \"attn\": \"sdpa\", \"batch\": 8, \"seq\": 300, \"weights\": \"bf16\", \"generate\": 20"
cp "$O/sdpa_workspace.log" /dev/null
ls -la "$O"
