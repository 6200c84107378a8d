#!/bin/bash
# Issue 42 point 4: snapshots with the newest fields, and a training run that ran out of memory
# (scripts/record_new_fields.py), then the families batch with the time left.
# Output: $OUT/new_fields.tar.xz
set -u
D=$(mktemp -d)
PYTORCH_CUDA_ALLOC_CONF=max_split_size_mb:256,garbage_collection_threshold:0.8 \
  timeout 150 python3 scripts/record_new_fields.py "$D" 2>&1 | tail -3
PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True NAME=new_fields_expandable \
  timeout 100 python3 scripts/record_new_fields.py "$D" 2>&1 | tail -3
for f in "$D"/*.pickle; do [ -e "$f" ] && xz -6 -T0 "$f"; done
ls -la "$D" | tail -n +2 | awk '{print $5, $9}'
tar -C "$D" -cJf "$OUT/new_fields.tar.xz" .
