#!/bin/bash
# Issue 42: scripts/torchao_bench_probe.py cold then warm (the same inductor cache dir, two
# processes) for 8- and 4-bit states around the 8,192-block boundary. Carry .whl (torchao).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site
for opt in torchao_adamw8bit torchao_adamw4bit; do
  for last in 1024 960; do
    C=$(mktemp -d)
    R="4096 7680 8192 8320 9216 10240 11264 16384"
    [ $last = 960 ] && R="7680 8160 8400 9600 11520"
    for mode in cold warm; do
      echo "$opt $last $mode"
      TORCHINDUCTOR_CACHE_DIR=$C timeout 250 python3 scripts/torchao_bench_probe.py $opt $last $R 2>/dev/null \
        | python3 -c 'import json,sys; d=json.load(sys.stdin); print(d["l2"], [(p["rows"], p["shape"], p["l2_allocs"], len(p["allocs"])) for p in d["params"]])'
    done
  done
done
