#!/bin/bash
# On the GPU machine: PyTorch at the boundaries `gpumem fit` found for GPT-2 small on 24 GiB
# (each value and the next, per remedy), and the planted fragmentation case on a 4 GiB card,
# each in a fresh process. Needs (carried) .gpu/reference_models.py. Prints JSON lines.
set -u
O=${OUT:-/tmp/gpumem-out}
mkdir -p "$O"
cp scripts/fit_check.py .gpu/
cd .gpu
MIB=$((1 << 20))
A24=$(( (24 << 30) - 518 * MIB ))   # --capacity 24GiB: 24 GiB less the CUDA context
A4=$(( (4 << 30) - 512 * MIB ))     # --capacity 4GiB: the context takes at most an eighth
run() { # CONF ALLOWED ARGS...
  local conf=$1 allowed=$2; shift 2
  PYTORCH_CUDA_ALLOC_CONF=$conf ALLOWED=$allowed timeout 300 python3 fit_check.py "$@" 2>>"$O/err.txt" || echo "{\"args\": \"$*\", \"failed\": true}"
}
{
  run "" $A4 frag
  run "expandable_segments:True" $A4 frag
  run "max_split_size_mb:128" $A4 frag
} >"$O/frag.jsonl" &
{
  for b in ${BATCHES_PLAIN:-14 15}; do run "" $A24 gpt $b; done
  for b in ${BATCHES_SGD:-14 15}; do run "" $A24 gpt $b sgd; done
} >"$O/fit_plain.jsonl" &
{
  for b in ${BATCHES_EXP:-16 17}; do run "expandable_segments:True" $A24 gpt $b; done
  for b in ${BATCHES_SPLIT:-16 17}; do run "max_split_size_mb:128" $A24 gpt $b; done
} >"$O/fit_conf.jsonl" &
{
  for b in ${BATCHES_AMP:-19 20}; do run "" $A24 gpt $b amp; done
  for b in ${BATCHES_CKPT:-22 23}; do run "" $A24 gpt $b ckpt; done
} >"$O/fit_model.jsonl" &
wait
cat "$O"/*.jsonl | cut -c1-400
