#!/bin/bash
# Issue 38: records further cases of the new families on the H200 (one fresh process each, with
# PyTorch's snapshot): every mode the published-config test runs (bf16 weights with LoRA,
# generation), sliding windows in bf16, Gemma-3 with both layer types, checkpointing, MoE.
# Output: $OUT/cases.tar.xz (hf_NAME.json, NAME.config.json, snapshot_NAME.pickle.xz).
set -u
D=$(mktemp -d)
Q3='"vocab_size": 151936, "hidden_size": 1024, "intermediate_size": 3072, "num_hidden_layers": 2, "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128, "tie_word_embeddings": true'
GE='"vocab_size": 256000, "hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 2, "num_attention_heads": 8, "num_key_value_heads": 1, "head_dim": 256'
G2='"vocab_size": 256000, "hidden_size": 1152, "intermediate_size": 4608, "num_hidden_layers": 2, "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256, "sliding_window": 256'
G3='"vocab_size": 262144, "hidden_size": 1152, "intermediate_size": 6912, "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 256, "sliding_window": 256'
G36='"vocab_size": 32000, "hidden_size": 1152, "intermediate_size": 4608, "num_hidden_layers": 6, "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 256, "sliding_window": 256'
P3='"vocab_size": 32064, "hidden_size": 1024, "intermediate_size": 2816, "num_hidden_layers": 2, "num_attention_heads": 16, "num_key_value_heads": 16, "pad_token_id": 32000'
P3W='"vocab_size": 32064, "hidden_size": 1024, "intermediate_size": 2816, "num_hidden_layers": 2, "num_attention_heads": 16, "num_key_value_heads": 16, "pad_token_id": 32000, "sliding_window": 256'
P4='"vocab_size": 100352, "hidden_size": 1280, "intermediate_size": 4480, "num_hidden_layers": 2, "num_attention_heads": 10, "num_key_value_heads": 2, "pad_token_id": 100349'
MX='"vocab_size": 32000, "hidden_size": 1024, "intermediate_size": 3584, "num_hidden_layers": 2, "num_attention_heads": 16, "num_key_value_heads": 8, "num_local_experts": 8, "num_experts_per_tok": 2'
QM='"vocab_size": 151936, "hidden_size": 1024, "intermediate_size": 3072, "moe_intermediate_size": 768, "num_experts": 16, "num_experts_per_tok": 4, "num_hidden_layers": 2, "num_attention_heads": 16, "num_key_value_heads": 4, "head_dim": 128'
GP2='"vocab_size": 16000, "n_embd": 512, "n_layer": 4, "n_head": 8, "n_positions": 1024'
MS='"vocab_size": 32000, "hidden_size": 1024, "intermediate_size": 3584, "num_hidden_layers": 2, "num_attention_heads": 16, "num_key_value_heads": 8, "sliding_window": 128'
G2W='"vocab_size": 256000, "hidden_size": 1152, "intermediate_size": 4608, "num_hidden_layers": 2, "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256, "sliding_window": 128'
# ONLY=REGEX records the matching names; a case is not started after the epoch second END_AT
# (default: 540 s after the start).
END_AT=${END_AT:-$(( $(date +%s) + 540 ))}
rec() { # name lora_targets json
  local n=$1 t=$2 j=$3
  if [[ -n ${ONLY:-} && ! $n =~ $ONLY ]]; then return; fi
  if (( $(date +%s) > END_AT )); then echo "$n: skipped (deadline)"; return; fi
  SNAP=$n LORA_TARGETS=$t timeout 300 python3 scripts/hf_record.py "$D" "{\"name\": \"$n\", $j}" 2>&1 | tail -2
}
T='"batch": 2, "seq": 512, "opt": "adamw"'
G='"batch": 2, "seq": 128, "weights": "bf16", "generate": 32'
# in priority order: the cases behind the published configs gpumem still refuses first
rec gemma3_t_lora_bf16w "" "\"model_type\": \"gemma3_text\", \"cfg\": {$G3}, \"attn\": \"sdpa\", $T, \"weights\": \"bf16\", \"lora\": true"
rec phi3_t_sw_lora_bf16w "qkv_proj,o_proj" "\"model_type\": \"phi3\", \"cfg\": {$P3W}, \"attn\": \"sdpa\", $T, \"weights\": \"bf16\", \"lora\": true"
rec gemma3_t_generate_bf16 "" "\"model_type\": \"gemma3_text\", \"cfg\": {$G3}, \"attn\": \"sdpa\", \"batch\": 2, \"seq\": 240, \"weights\": \"bf16\", \"generate\": 32"
rec gemma2_t_generate_bf16 "" "\"model_type\": \"gemma2\", \"cfg\": {$G2}, \"attn\": \"sdpa\", \"batch\": 2, \"seq\": 240, \"weights\": \"bf16\", \"generate\": 32"
rec phi3_t_sw_generate_bf16 "" "\"model_type\": \"phi3\", \"cfg\": {$P3W}, \"attn\": \"sdpa\", \"batch\": 2, \"seq\": 240, \"weights\": \"bf16\", \"generate\": 32"
# held out (2026-12-05, after sliding-window generation was modelled): other windows, batches
# and offsets, Mistral's sliding-only mask, Gemma-3 with a full layer, Phi-4's grouped heads
# over a `cat`-rotated query in bf16
rec mistral_t_sw_generate_bf16 "" "\"model_type\": \"mistral\", \"cfg\": {$MS}, \"attn\": \"sdpa\", \"batch\": 1, \"seq\": 100, \"weights\": \"bf16\", \"generate\": 48"
rec gemma2_t_w128_b3_generate_bf16 "" "\"model_type\": \"gemma2\", \"cfg\": {$G2W}, \"attn\": \"sdpa\", \"batch\": 3, \"seq\": 100, \"weights\": \"bf16\", \"generate\": 40"
rec gemma3_6l_generate_bf16 "" "\"model_type\": \"gemma3_text\", \"cfg\": {$G36}, \"attn\": \"sdpa\", \"batch\": 2, \"seq\": 240, \"weights\": \"bf16\", \"generate\": 32"
rec phi4_t_lora_bf16w "qkv_proj,o_proj" "\"model_type\": \"phi3\", \"cfg\": {$P4}, \"attn\": \"sdpa\", $T, \"weights\": \"bf16\", \"lora\": true"
rec mistral_t_sw_lora_bf16w "" "\"model_type\": \"mistral\", \"cfg\": {$MS}, \"attn\": \"sdpa\", $T, \"weights\": \"bf16\", \"lora\": true"
rec gpt2_t_lora_bf16w "c_attn,c_proj" "\"family\": \"gpt2\", \"cfg\": {$GP2}, \"attn\": \"sdpa\", $T, \"weights\": \"bf16\", \"lora\": true"
rec gpt2_t_generate_bf16 "" "\"family\": \"gpt2\", \"cfg\": {$GP2}, \"attn\": \"sdpa\", $G"
rec phi3_t_sw_fp32 "" "\"model_type\": \"phi3\", \"cfg\": {$P3W}, \"attn\": \"sdpa\", $T"
rec gemma2_t_sdpa_fp32 "" "\"model_type\": \"gemma2\", \"cfg\": {$G2}, \"attn\": \"sdpa\", $T"
rec gemma3_6l_sdpa_fp32 "" "\"model_type\": \"gemma3_text\", \"cfg\": {$G36}, \"attn\": \"sdpa\", $T"
rec qwen3_t_lora_bf16w "" "\"model_type\": \"qwen3\", \"cfg\": {$Q3}, \"attn\": \"sdpa\", $T, \"weights\": \"bf16\", \"lora\": true"
rec gemma_t_lora_bf16w "" "\"model_type\": \"gemma\", \"cfg\": {$GE}, \"attn\": \"sdpa\", $T, \"weights\": \"bf16\", \"lora\": true"
rec phi3_t_lora_bf16w "qkv_proj,o_proj" "\"model_type\": \"phi3\", \"cfg\": {$P3}, \"attn\": \"sdpa\", $T, \"weights\": \"bf16\", \"lora\": true"
rec gemma2_t_lora_bf16w "" "\"model_type\": \"gemma2\", \"cfg\": {$G2}, \"attn\": \"sdpa\", $T, \"weights\": \"bf16\", \"lora\": true"
rec gpt2_t_lora_fp32 "c_attn,c_proj" "\"family\": \"gpt2\", \"cfg\": {$GP2}, \"attn\": \"sdpa\", $T, \"lora\": true"
rec gpt2_t_eager_fp32 "" "\"family\": \"gpt2\", \"cfg\": {$GP2}, \"attn\": \"eager\", $T"
rec gpt2_t_amp_bf16 "" "\"family\": \"gpt2\", \"cfg\": {$GP2}, \"attn\": \"sdpa\", $T, \"amp\": \"bf16\""
rec qwen3_t_ckpt_fp32 "" "\"model_type\": \"qwen3\", \"cfg\": {$Q3}, \"attn\": \"sdpa\", $T, \"ckpt\": true"
rec qwen3_t_generate_bf16 "" "\"model_type\": \"qwen3\", \"cfg\": {$Q3}, \"attn\": \"sdpa\", $G"
rec gemma_t_generate_bf16 "" "\"model_type\": \"gemma\", \"cfg\": {$GE}, \"attn\": \"sdpa\", $G"
rec phi3_t_generate_bf16 "" "\"model_type\": \"phi3\", \"cfg\": {$P3}, \"attn\": \"sdpa\", $G"
rec phi4_t_sdpa_fp32 "" "\"model_type\": \"phi3\", \"cfg\": {$P4}, \"attn\": \"sdpa\", $T"
rec gemma3_6l_eager_fp32 "" "\"model_type\": \"gemma3_text\", \"cfg\": {$G36}, \"attn\": \"eager\", $T"
# sort and the index_put_ backward past cub's single tile (4,096 pairs: 1,024 tokens x 4; 8,192:
# 2,048 x 4), checkpointing (topk and sort recomputed), bf16 weights without LoRA (grouped_mm's
# CUTLASS kernel, the router's casts)
rec mixtral_t_lora_bf16w "" "\"model_type\": \"mixtral\", \"cfg\": {$MX}, \"attn\": \"sdpa\", $T, \"weights\": \"bf16\", \"lora\": true"
rec mixtral_t_aux_fp32 "" "\"model_type\": \"mixtral\", \"cfg\": {$MX, \"output_router_logits\": true}, \"attn\": \"sdpa\", $T"
rec mixtral_t_generate_bf16 "" "\"model_type\": \"mixtral\", \"cfg\": {$MX}, \"attn\": \"sdpa\", $G"
rec qwen3moe_t_generate_bf16 "" "\"model_type\": \"qwen3_moe\", \"cfg\": {$QM}, \"attn\": \"sdpa\", $G"
rec qwen3moe_t_s1024_fp32 "" "\"model_type\": \"qwen3_moe\", \"cfg\": {$QM}, \"attn\": \"sdpa\", \"batch\": 2, \"seq\": 1024, \"opt\": \"adamw\""
rec mixtral_t_ckpt_fp32 "" "\"model_type\": \"mixtral\", \"cfg\": {$MX}, \"attn\": \"sdpa\", $T, \"ckpt\": true"
rec mixtral_t_bf16w "" "\"model_type\": \"mixtral\", \"cfg\": {$MX}, \"attn\": \"sdpa\", $T, \"weights\": \"bf16\""
rec qwen3moe_t_eager_experts_fp32 "" "\"model_type\": \"qwen3_moe\", \"cfg\": {$QM}, \"attn\": \"sdpa\", $T, \"experts\": \"eager\""
rec gpt2_tut_b4_s512_fp32 "" "\"family\": \"gpt2\", \"cfg\": {}, \"attn\": \"sdpa\", \"batch\": 4, \"seq\": 512, \"opt\": \"adamw\""
rec gpt2_tut_b4_s512_ckpt_fp32 "" "\"family\": \"gpt2\", \"cfg\": {}, \"attn\": \"sdpa\", \"batch\": 4, \"seq\": 512, \"opt\": \"adamw\", \"ckpt\": true"
# 2026-12-05 (third GPU call): BERT's masked-LM head (the published bert-base-uncased's
# architecture), plain, with LoRA and over bf16 weights; Gemma-3's float32 generation past the
# window (refused today: the memory-efficient kernel's masked decode step); held-out GPT-2
# shapes for eager attention and bf16 autocast (modelled this session)
BT='"num_hidden_layers": 4, "hidden_size": 512, "num_attention_heads": 8, "intermediate_size": 2048'
GP2B='"vocab_size": 16000, "n_embd": 768, "n_layer": 2, "n_head": 12, "n_positions": 1024'
mlm() { # name lora_targets json
  local n=$1 t=$2 j=$3
  if [[ -n ${ONLY:-} && ! $n =~ $ONLY ]]; then return; fi
  if (( $(date +%s) > END_AT )); then echo "$n: skipped (deadline)"; return; fi
  BERT_MLM=1 SNAP=$n LORA_TARGETS=$t timeout 300 python3 scripts/hf_record.py "$D" "{\"name\": \"$n\", $j}" 2>&1 | tail -2
}
mlm bert_t_mlm_fp32 "" "\"model_type\": \"bert\", \"family\": \"bert_mlm\", \"cfg\": {$BT}, \"attn\": \"sdpa\", \"batch\": 4, \"seq\": 256, \"opt\": \"adamw\""
mlm bert_t_mlm_lora_fp32 "query,value" "\"model_type\": \"bert\", \"family\": \"bert_mlm\", \"cfg\": {$BT}, \"attn\": \"sdpa\", \"batch\": 4, \"seq\": 256, \"opt\": \"adamw\", \"lora\": true"
mlm bert_t_mlm_lora_bf16w "query,value" "\"model_type\": \"bert\", \"family\": \"bert_mlm\", \"cfg\": {$BT}, \"attn\": \"sdpa\", \"batch\": 4, \"seq\": 256, \"opt\": \"adamw\", \"lora\": true, \"weights\": \"bf16\""
mlm bert_base_mlm_b4_s512_fp32 "" "\"model_type\": \"bert\", \"family\": \"bert_mlm\", \"cfg\": {}, \"attn\": \"sdpa\", \"batch\": 4, \"seq\": 512, \"opt\": \"adamw\""
rec gemma3_t_generate_fp32 "" "\"model_type\": \"gemma3_text\", \"cfg\": {$G3}, \"attn\": \"sdpa\", \"batch\": 2, \"seq\": 240, \"generate\": 32"
rec gpt2_m2_eager_b1_s256_fp32 "" "\"family\": \"gpt2\", \"cfg\": {$GP2B}, \"attn\": \"eager\", \"batch\": 1, \"seq\": 256, \"opt\": \"adamw\""
rec gpt2_m2_amp_b3_s384 "" "\"family\": \"gpt2\", \"cfg\": {$GP2B}, \"attn\": \"sdpa\", \"batch\": 3, \"seq\": 384, \"opt\": \"adamw\", \"amp\": \"bf16\""
# 2026-12-05 (fifth GPU call): prompts that reach the sliding window in generation (refused
# today: the prefill's window mask and its trimmed cache), BERT's classifier over bf16 weights
# (allowed once the masked-LM LoRA case matched) and a held-out masked-LM case
cls() { # name json
  local n=$1 j=$2
  if [[ -n ${ONLY:-} && ! $n =~ $ONLY ]]; then return; fi
  if (( $(date +%s) > END_AT )); then echo "$n: skipped (deadline)"; return; fi
  BERT_CLS=1 SNAP=$n timeout 300 python3 scripts/hf_record.py "$D" "{\"name\": \"$n\", $j}" 2>&1 | tail -2
}
GP='"batch": 2, "seq": 300, "generate": 16'
rec gemma3_t_p300_generate_bf16 "" "\"model_type\": \"gemma3_text\", \"cfg\": {$G3}, \"attn\": \"sdpa\", $GP, \"weights\": \"bf16\""
rec gemma3_t_p300_generate_fp32 "" "\"model_type\": \"gemma3_text\", \"cfg\": {$G3}, \"attn\": \"sdpa\", $GP"
rec mistral_t_p200_generate_bf16 "" "\"model_type\": \"mistral\", \"cfg\": {$MS}, \"attn\": \"sdpa\", \"batch\": 1, \"seq\": 200, \"generate\": 16, \"weights\": \"bf16\""
rec gemma2_t_p300_generate_bf16 "" "\"model_type\": \"gemma2\", \"cfg\": {$G2}, \"attn\": \"sdpa\", $GP, \"weights\": \"bf16\""
cls bert_t_cls_bf16w "\"model_type\": \"bert\", \"family\": \"bert\", \"cfg\": {$BT, \"num_labels\": 3}, \"attn\": \"sdpa\", \"batch\": 4, \"seq\": 256, \"opt\": \"adamw\", \"weights\": \"bf16\""
mlm bert_base_mlm_lora_bf16w_b8_s512 "query,value" "\"model_type\": \"bert\", \"family\": \"bert_mlm\", \"cfg\": {}, \"attn\": \"sdpa\", \"batch\": 8, \"seq\": 512, \"opt\": \"adamw\", \"lora\": true, \"weights\": \"bf16\""
# (with SNAP, PyTorch's memory-history recording breaks HF checkpointing's recompute under
# dropout with a SystemError: the BERT and GPT-2 checkpointing cases below were recorded
# without a snapshot, by scripts/hf_record.py directly, on 2026-12-05)
# 2026-12-05 (sixth GPU call): BERT with HF gradient checkpointing (refused today), GPT-2's
# eager attention with checkpointing, Mixtral under bf16 autocast and with eager attention
# (refused today: ground truth for modelling them)
cls bert_t_cls_ckpt_fp32 "\"model_type\": \"bert\", \"family\": \"bert\", \"cfg\": {$BT, \"num_labels\": 3}, \"attn\": \"sdpa\", \"batch\": 4, \"seq\": 256, \"opt\": \"adamw\", \"ckpt\": true"
mlm bert_t_mlm_ckpt_fp32 "" "\"model_type\": \"bert\", \"family\": \"bert_mlm\", \"cfg\": {$BT}, \"attn\": \"sdpa\", \"batch\": 4, \"seq\": 256, \"opt\": \"adamw\", \"ckpt\": true"
rec gpt2_t_eager_ckpt_fp32 "" "\"family\": \"gpt2\", \"cfg\": {$GP2}, \"attn\": \"eager\", $T, \"ckpt\": true"
rec mixtral_t_amp_bf16 "" "\"model_type\": \"mixtral\", \"cfg\": {$MX}, \"attn\": \"sdpa\", $T, \"amp\": \"bf16\""
rec mixtral_t_eager_fp32 "" "\"model_type\": \"mixtral\", \"cfg\": {$MX}, \"attn\": \"eager\", $T"
python3 -c "import transformers, torch; print('transformers', transformers.__version__, 'torch', torch.__version__)"
python3 - "$D" <<'PY'
import importlib, sys
for m in ("transformers.integrations.moe",):
    try:
        mod = importlib.import_module(m); print(m, mod.__file__)
    except Exception as e:
        print(m, e)
PY
cp /opt/torch/.venv/lib/python3.12/site-packages/transformers/integrations/moe.py "$D/moe_py.txt" 2>/dev/null
for f in "$D"/snapshot_*.pickle; do [ -e "$f" ] || continue; xz -6 -T0 "$f"; done
ls -la "$D" | tail -n +2 | awk '{print $5, $9}'
tar -C "$D" -cJf "$OUT/cases${TAG:-}.tar.xz" .
