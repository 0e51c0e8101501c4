#!/bin/sh
# clusterctl's dependencies as wheels for the device machine's Python (default cp312, manylinux x86_64), into
# tests/gpu/wheels (git-ignored), for the device run's offline install (run_gpu_checks.sh --wheels). torch is the
# machine's own (a CUDA build): not fetched.
#   tests/gpu/fetch_wheels.sh [PYTHON_VERSION]     e.g. 3.12
set -eu
root=$(cd "$(dirname "$0")/../.." && pwd)
pyver=${1:-3.12}
dest="$root/tests/gpu/wheels"
mkdir -p "$dest"
exec python3 -m pip download -q --only-binary=:all: --python-version "$pyver" --implementation cp \
  --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 \
  --platform manylinux_2_26_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_5_x86_64 --platform manylinux1_x86_64 \
  --platform linux_x86_64 -d "$dest" \
  paramiko pyyaml tenacity pydantic click rich platformdirs py-spy
