#!/bin/bash
# Fills the ignored .whl/ds with what scripts/gpu-zero-cases.sh installs offline on the GPU
# machine (which reaches no network): DeepSpeed 0.19.6's sdist and the pure-Python (or
# manylinux, CPython 3.12) wheels of its dependencies that the machine's PyTorch image lacks.
# Run here, where the package registries are reachable; then carry ".whl/ds" in the call.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .whl/ds
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
python3 -m pip download -q --no-deps -d .whl/ds deepspeed==0.19.6
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 -d .whl/ds \
  einops hjson msgpack ninja py-cpuinfo 'pydantic>=2' pydantic-core annotated-types \
  typing-inspection typing-extensions setuptools wheel
ls .whl/ds
