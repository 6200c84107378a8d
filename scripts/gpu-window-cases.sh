#!/bin/bash
# Issue 38: generation in bf16 past a sliding window of more than 512 keys (refused until
# recorded): what SDPA allocates for a masked decode step (scripts/sdpa_mask_workspace.py), and
# whole cases of Gemma-2, Mistral and Gemma-3 recorded with PyTorch's snapshot.
# Output: $OUT/mask_ws.json, $OUT/cases.tar.xz (hf_NAME.json, NAME.config.json, snapshot_NAME.pickle.xz).
set -u
D=$(mktemp -d)
mkdir -p "$OUT"
timeout 200 python3 scripts/sdpa_mask_workspace.py "$OUT/mask_ws.json" > "$OUT/mask_ws.log" 2>&1
echo "mask probe rc=$? rows=$(wc -l < "$OUT/mask_ws.log")"
G2='"vocab_size": 256000, "hidden_size": 1152, "intermediate_size": 4608, "num_hidden_layers": 2, "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256, "sliding_window": 640'
G3='"vocab_size": 262144, "hidden_size": 1152, "intermediate_size": 6912, "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 256, "sliding_window": 600'
MS='"vocab_size": 32000, "hidden_size": 1024, "intermediate_size": 3584, "num_hidden_layers": 2, "num_attention_heads": 16, "num_key_value_heads": 8, "sliding_window": 1024'
rec() { # name json
  SNAP=$1 timeout 240 python3 scripts/hf_record.py "$D" "{\"name\": \"$1\", $2}" 2>&1 | tail -2
}
rec gemma2_t_w640_p600_generate_bf16 "\"model_type\": \"gemma2\", \"cfg\": {$G2}, \"attn\": \"sdpa\", \"batch\": 2, \"seq\": 600, \"generate\": 80, \"weights\": \"bf16\""
rec gemma3_t_w600_p560_generate_bf16 "\"model_type\": \"gemma3_text\", \"cfg\": {$G3}, \"attn\": \"sdpa\", \"batch\": 3, \"seq\": 560, \"generate\": 72, \"weights\": \"bf16\""
rec mistral_t_w1024_p1000_generate_bf16 "\"model_type\": \"mistral\", \"cfg\": {$MS}, \"attn\": \"sdpa\", \"batch\": 1, \"seq\": 1000, \"generate\": 48, \"weights\": \"bf16\""
for f in "$D"/snapshot_*.pickle; do xz -T4 "$f"; done
tar -C "$D" -cJf "$OUT/cases.tar.xz" .
ls -la "$D"
