#!/usr/bin/env bash
# Download, on a machine with a package index, the wheels that `bench/gpu_calibrate.sh` installs on a lent GPU
# machine without one (its image has torch, transformers, peft, accelerate, numpy, scikit-learn, PyYAML and
# nvidia-ml-py, but not vramfit's pydantic or skops, nor bitsandbytes or liger-kernel). They go to .whl/ (keep it out of git:
# echo /.whl/ >> .git/info/exclude) and travel with the call (carry: [".whl"]); about 45 MB, most of it bitsandbytes.
#
#   bash bench/fetch_calibration_wheels.sh [PYTHON_VERSION]     # the GPU machine's Python, default 3.12
set -euo pipefail
PY=${1:-3.12}
mkdir -p .whl
platforms=()
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_24_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64; do
  platforms+=(--platform "$p")
done
python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$PY" --implementation cp "${platforms[@]}" \
  -d .whl pydantic==2.12.5 pydantic-core==2.41.5 annotated-types typing-inspection typing-extensions skops \
  prettytable wcwidth bitsandbytes liger-kernel
ls -la .whl
