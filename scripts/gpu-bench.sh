#!/bin/bash
# Allocator speed on the GPU machine: PyTorch's C++ allocator (alloc_bench.py) and gpumem's,
# in the same call, same size lists. Needs (carried) target/release/gpumem and .gpu/alloc_bench.py.
set -u
O=${OUT:-/tmp/gpumem-out}
mkdir -p "$O"
lscpu | grep -E "Model name|^CPU\(s\)|MHz" | head -4
(cd .gpu && python3 alloc_bench.py "$O/torch_bench.json") 2>&1 | tail -2
for i in 1 2 3; do ./target/release/gpumem bench --pytorch "$O/torch_bench.json" --repeat 7 | tee "$O/bench_$i.txt"; done
./target/release/gpumem bench --pytorch "$O/torch_bench.json" --repeat 7 --json > "$O/bench.json"
