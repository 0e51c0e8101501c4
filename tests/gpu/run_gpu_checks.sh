#!/bin/sh
# Preflight + the quickstart demo with NCCL on this GPU machine (NOT part of `make test`; see gpu_checks.py).
#   tests/gpu/run_gpu_checks.sh [--steps N] [--keep]
set -eu
root=$(cd "$(dirname "$0")/../.." && pwd)
py="$root/.venv/bin/python"
[ -x "$py" ] || py=python3
exec "$py" "$root/tests/gpu/gpu_checks.py" "$@"
