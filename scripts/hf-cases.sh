# The further Hugging Face cases of fixtures/hf (issue 14), for scripts/gpu-hf-traces.sh:
#   source scripts/hf-cases.sh; bash scripts/gpu-hf-traces.sh "${CASES[@]}"
LT='"vocab_size": 16000, "hidden_size": 512, "intermediate_size": 1408, "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 2, "max_position_embeddings": 2048'
CASES=(
 llama_s_sdpa_adamw_fp32
 "llama_t_sdpa_adamw_fp32=\"family\": \"llama\", \"cfg\": {$LT}, \"attn\": \"sdpa\", \"batch\": 2, \"seq\": 512, \"opt\": \"adamw\""
 "llama_t_eager_adamw_fp32=\"family\": \"llama\", \"cfg\": {$LT}, \"attn\": \"eager\", \"batch\": 2, \"seq\": 512, \"opt\": \"adamw\""
 "llama_t_lora_adamw_fp32=\"family\": \"llama\", \"cfg\": {$LT}, \"attn\": \"sdpa\", \"batch\": 2, \"seq\": 512, \"opt\": \"adamw\", \"lora\": true"
 "llama_t_ckpt_adamw_fp32=\"family\": \"llama\", \"cfg\": {$LT}, \"attn\": \"sdpa\", \"batch\": 2, \"seq\": 512, \"opt\": \"adamw\", \"ckpt\": true"
 "llama_t_sdpa_adamw_bf16w=\"family\": \"llama\", \"cfg\": {$LT}, \"attn\": \"sdpa\", \"batch\": 2, \"seq\": 512, \"opt\": \"adamw\", \"weights\": \"bf16\""
 "llama_t_nograd_fp32=\"family\": \"llama\", \"cfg\": {$LT}, \"attn\": \"sdpa\", \"batch\": 2, \"seq\": 512, \"opt\": \"adamw\", \"no_grad\": true"
 "qwen2_t_sdpa_adamw_fp32=\"family\": \"qwen2\", \"cfg\": {$LT}, \"attn\": \"sdpa\", \"batch\": 2, \"seq\": 512, \"opt\": \"adamw\""
 "mistral_t_sdpa_adamw_fp32=\"family\": \"mistral\", \"cfg\": {$LT, \"sliding_window\": 256}, \"attn\": \"sdpa\", \"batch\": 2, \"seq\": 512, \"opt\": \"adamw\""
 "gpt2_t_sdpa_adamw_fp32=\"family\": \"gpt2\", \"cfg\": {\"vocab_size\": 16000, \"n_embd\": 512, \"n_layer\": 4, \"n_head\": 8, \"n_positions\": 1024}, \"attn\": \"sdpa\", \"batch\": 2, \"seq\": 512, \"opt\": \"adamw\""
 "bert_t_cls_adamw_fp32=\"family\": \"bert\", \"cfg\": {\"num_hidden_layers\": 4, \"hidden_size\": 512, \"num_attention_heads\": 8, \"intermediate_size\": 2048, \"num_labels\": 3}, \"attn\": \"sdpa\", \"batch\": 4, \"seq\": 256, \"opt\": \"adamw\""
 "llama_t_generate_bf16=\"family\": \"llama\", \"cfg\": {$LT}, \"attn\": \"sdpa\", \"batch\": 2, \"seq\": 128, \"weights\": \"bf16\", \"generate\": 16"
 gpt2_hf_sdpa_adamw_fp32 bert_base_cls_adamw_fp32 llama_s_sdpa_adamw_bf16amp llama_s_generate_bf16
)
