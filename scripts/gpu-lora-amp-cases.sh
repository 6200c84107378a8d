#!/bin/bash
# Issues 38 and 39: records, on the GPU machine, LoRA and bf16 autocast under DDP and FSDP2 at
# world size 1 (scripts/dist_record.py over ../shared/tools/dist1.py, carried in gpu_carry/)
# and, on one GPU, Llama checkpointing over bf16 weights or bf16 autocast, bf16 weights with eager
# attention or under autocast, eager generation, LoRA generation and Mistral's eager attention
# (../shared/tools/hf_models.py --case-json, carried in gpu_carry/, with PyTorch's snapshot).
# One fresh process a case; the archive is rewritten after each case, so a call cut short
# still returns what it recorded. DIST_CASES, HF_CASES and FAM_CASES (space-separated names; HF_CASES or
# FAM_CASES empty: none) pick cases. gpu_carry/ holds ../shared/tools' dist1.py, hf_models.py
# and hf_families.py. Output: $OUT/cases.tar.xz (dist1_NAME.json, hf_NAME.json,
# snapshot_NAME.pickle.xz, log.txt).
set -u
D=$(mktemp -d)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
LLAMA_S='{"vocab_size": 32000, "hidden_size": 1024, "intermediate_size": 2816, "num_hidden_layers": 8, "num_attention_heads": 16, "num_key_value_heads": 4, "max_position_embeddings": 2048}'
pack() {
  for f in "$D"/snapshot_*.pickle; do [ -f "$f" ] && xz -6 -T0 "$f"; done
  tar -C "$D" -cJf "$OUT/cases.tar.xz.part" . && mv "$OUT/cases.tar.xz.part" "$OUT/cases.tar.xz"
}
port=29700
for c in ${DIST_CASES-fsdp2_llama_s_lora_fp32 fsdp2_llama_s_lora_bf16mp fsdp2_llama_s_adamw_amp_bf16 ddp_llama_s_lora_fp32 fsdp2_llama_s_lora_bf16w fsdp2_llama_s_lora_fp32_ckpt ddp_llama_s_adamw_amp_bf16}; do
  port=$((port + 1))
  echo "== $c" >>"$D/log.txt"
  MASTER_PORT=$port timeout 200 python3 scripts/dist_record.py "$D" "$c" >>"$D/log.txt" 2>&1 || echo "case $c failed" >>"$D/log.txt"
  tail -2 "$D/log.txt"
  pack
done
cd gpu_carry
LLAMA_T='{"vocab_size": 16000, "hidden_size": 512, "intermediate_size": 1408, "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 2, "max_position_embeddings": 2048}'
MISTRAL_T='{"vocab_size": 16000, "hidden_size": 512, "intermediate_size": 1408, "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 2, "max_position_embeddings": 2048, "sliding_window": 256}'
# name|case json after the name (issue 38: checkpointing over bf16 weights or autocast on
# llama_s; bf16 weights with eager attention, bf16 weights under autocast and eager
# generation on llama_t, each a combination gpumem refuses until it is checked)
HF_LIST=(
  "llama_s_sdpa_adamw_bf16w_ckpt|\"family\": \"llama\", \"cfg\": $LLAMA_S, \"attn\": \"sdpa\", \"batch\": 4, \"seq\": 1024, \"opt\": \"adamw\", \"ckpt\": true, \"weights\": \"bf16\""
  "llama_s_sdpa_adamw_bf16amp_ckpt|\"family\": \"llama\", \"cfg\": $LLAMA_S, \"attn\": \"sdpa\", \"batch\": 4, \"seq\": 1024, \"opt\": \"adamw\", \"ckpt\": true, \"amp\": \"bf16\""
  "llama_t_eager_adamw_bf16w|\"family\": \"llama\", \"cfg\": $LLAMA_T, \"attn\": \"eager\", \"batch\": 2, \"seq\": 512, \"opt\": \"adamw\", \"weights\": \"bf16\""
  "llama_t_sdpa_adamw_bf16w_bf16amp|\"family\": \"llama\", \"cfg\": $LLAMA_T, \"attn\": \"sdpa\", \"batch\": 2, \"seq\": 512, \"opt\": \"adamw\", \"weights\": \"bf16\", \"amp\": \"bf16\""
  "llama_t_eager_generate_bf16|\"family\": \"llama\", \"cfg\": $LLAMA_T, \"attn\": \"eager\", \"batch\": 2, \"seq\": 128, \"weights\": \"bf16\", \"generate\": 16"
  "mistral_t_eager_adamw_fp32|\"family\": \"mistral\", \"cfg\": $MISTRAL_T, \"attn\": \"eager\", \"batch\": 2, \"seq\": 512, \"opt\": \"adamw\""
  "llama_t_lora_generate_bf16|\"family\": \"llama\", \"cfg\": $LLAMA_T, \"attn\": \"sdpa\", \"batch\": 2, \"seq\": 128, \"weights\": \"bf16\", \"lora\": true, \"generate\": 16"
  "llama_t_eager_generate_fp32|\"family\": \"llama\", \"cfg\": $LLAMA_T, \"attn\": \"eager\", \"batch\": 2, \"seq\": 128, \"generate\": 16"
)
for spec in "${HF_LIST[@]}"; do
  [ -n "${HF_CASES-x}" ] || break
  name=${spec%%|*}; rest=${spec#*|}
  case " ${HF_CASES-$name} " in *" $name "*) ;; *) continue ;; esac
  echo "== $name" >>"$D/log.txt"
  SNAP=$name timeout 200 python3 hf_models.py "$D" --case-json "{\"name\": \"$name\", $rest}" >>"$D/log.txt" 2>&1 || echo "case $name failed" >>"$D/log.txt"
  tail -1 "$D/log.txt"
  pack
done
# mixture-of-experts and Gemma-2 combinations gpumem runs unrecorded (hf_families.py, carried in
# gpu_carry/): Mixtral's eager attention over bf16 weights, Mixtral under autocast with
# checkpointing, Gemma-2's eager attention over bf16 weights (its masks in bf16)
MIXTRAL='{"vocab_size": 32000, "hidden_size": 1024, "intermediate_size": 3584, "num_hidden_layers": 2, "num_attention_heads": 16, "num_key_value_heads": 8, "num_local_experts": 8, "num_experts_per_tok": 2, "max_position_embeddings": 4096}'
GEMMA2='{"vocab_size": 256000, "hidden_size": 2304, "intermediate_size": 9216, "num_hidden_layers": 2, "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256, "sliding_window": 4096, "query_pre_attn_scalar": 256, "final_logit_softcapping": 30.0, "attn_logit_softcapping": 50.0}'
FAM_LIST=(
  "mixtral_2l_b2_s512_adamw_bf16w_eager|\"model_type\": \"mixtral\", \"family\": \"mixtral\", \"cfg\": $MIXTRAL, \"attn\": \"eager\", \"batch\": 2, \"seq\": 512, \"opt\": \"adamw\", \"weights\": \"bf16\""
  "mixtral_2l_b2_s512_adamw_bf16amp_ckpt|\"model_type\": \"mixtral\", \"family\": \"mixtral\", \"cfg\": $MIXTRAL, \"attn\": \"sdpa\", \"batch\": 2, \"seq\": 512, \"opt\": \"adamw\", \"amp\": \"bf16\", \"ckpt\": true"
  "gemma2_2b_2l_b2_s512_adamw_bf16w_eager|\"model_type\": \"gemma2\", \"family\": \"gemma2\", \"cfg\": $GEMMA2, \"attn\": \"eager\", \"batch\": 2, \"seq\": 512, \"opt\": \"adamw\", \"weights\": \"bf16\""
)
for spec in "${FAM_LIST[@]}"; do
  [ -n "${FAM_CASES-x}" ] || break
  name=${spec%%|*}; rest=${spec#*|}
  case " ${FAM_CASES-$name} " in *" $name "*) ;; *) continue ;; esac
  echo "== $name" >>"$D/log.txt"
  SNAP=$name timeout 200 python3 hf_families.py "$D" "{\"name\": \"$name\", $rest}" >>"$D/log.txt" 2>&1 || echo "case $name failed" >>"$D/log.txt"
  tail -1 "$D/log.txt"
  pack
done
ls -la "$D" | tail -n +2 | awk '{print $5, $9}'
