#!/bin/bash
# One call on the GPU machine: PyTorch's allocator benchmark and gpumem's side by side, then new
# PyTorch allocator traces (seeds and settings not in ../shared) replayed by gpumem there.
# Needs (carried): target/release/gpumem, .gpu/alloc_traces.py, .gpu/alloc_bench.py (copied from
# ../shared/tools, not committed). Results land in $OUT.
set -u
O=${OUT:-/tmp/gpumem-out}
mkdir -p "$O/traces"
G=$PWD/target/release/gpumem
export PYTHONUNBUFFERED=1
nproc; lscpu | grep -E "Model name|MHz" | head -3
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c "import torch; print('torch', torch.__version__)"

echo "== allocator speed: PyTorch (C++) then gpumem, same machine, same call"
(cd .gpu && python3 alloc_bench.py "$O/torch_bench.json") 2>&1 | tail -3
"$G" bench --pytorch "$O/torch_bench.json" | tee "$O/bench.txt"
"$G" bench --pytorch "$O/torch_bench.json" --json > "$O/bench.json"

echo "== new traces"
rec() { # name kind seed nops conf fraction
  (cd .gpu && SEED=$3 NOPS=$4 PYTORCH_CUDA_ALLOC_CONF="$5" FRACTION=$6 timeout 120 python3 alloc_traces.py "$2" "$O/traces/$1.json") >/dev/null 2>"$O/traces/$1.err" || echo "record $1 failed: $(tail -2 "$O/traces/$1.err")"
}
rec mixed_s2 mixed 2 4000 "" 0
rec mixed_s3_gpu mixed 3 6000 "" 0
rec small_s2 small 2 4000 "" 0
rec large_s2 large 2 4000 "" 0
rec varlen_s2 varlen 2 4000 "" 0
rec frag_s2 frag 2 3000 "" 0
rec emptycache_s2 emptycache 2 4000 "" 0
rec oom_s2_frac05 oom 2 4000 "" 0.05
rec oom_s3_frac02_mss100 oom 3 3000 "max_split_size_mb:100" 0.02
rec mixed_s4_mss128_nsr60 mixed 4 4000 "max_split_size_mb:128,max_non_split_rounding_mb:60" 0
rec mixed_s5_pow2list mixed 5 4000 "roundup_power2_divisions:[2:2,16:4,64:8,>:2]" 0
rec small_s3_pow2_8 small 3 4000 "roundup_power2_divisions:8" 0
rec large_s3_expandable large 3 4000 "expandable_segments:True" 0
rec oom_s4_frac05_expandable oom 4 3000 "expandable_segments:True" 0.05
rec oom_s5_frac05_gc06 oom 5 3000 "garbage_collection_threshold:0.6" 0.05
rec large_s5_frac10_gc05 large 5 4000 "garbage_collection_threshold:0.5" 0.1
rec mixed_s6_lss40 mixed 6 4000 "large_segment_size_mb:40" 0
rec mixed_s7_exp_lss40 mixed 7 4000 "expandable_segments:True,large_segment_size_mb:40" 0
rec frag_s3_mss20 frag 3 3000 "max_split_size_mb:20" 0
rec varlen_s3_expandable varlen 3 4000 "expandable_segments:True" 0
rec oom_s6_frac03_mss64_gc07 oom 6 3000 "max_split_size_mb:64,garbage_collection_threshold:0.7" 0.03

echo "== replay of each new trace by gpumem"
for f in "$O"/traces/*.json; do "$G" replay "$f" --max-mismatches 2 | head -8; done | tee "$O/replays.txt"
(cd "$O" && tar czf traces.tgz traces && rm -rf traces)
ls -la "$O"
