#!/bin/sh
# The device run (issue 35): clusterctl on one GPU machine, bare, <= 8 minutes. NOT part of `make test`; its
# CPU-checkable parts are unit tests (tests/unit/checks/test_device_run.py). See tests/gpu/gpu_checks.py.
#   tests/gpu/run_gpu_checks.sh [--out DIR] [--wheels DIR] [--stages a,b] [--steps N] [--budget-s S] [--keep]
# With no --wheels and tests/gpu/wheels present (tests/gpu/fetch_wheels.sh), that dir is used.
set -eu
root=$(cd "$(dirname "$0")/../.." && pwd)
py="$root/.venv/bin/python"
[ -x "$py" ] || py=python3      # the device machine: its own python3 with its CUDA torch
case " $* " in
  *" --wheels"*) exec "$py" "$root/tests/gpu/gpu_checks.py" "$@" ;;
esac
if [ -d "$root/tests/gpu/wheels" ]; then
  exec "$py" "$root/tests/gpu/gpu_checks.py" --wheels "$root/tests/gpu/wheels" "$@"
fi
exec "$py" "$root/tests/gpu/gpu_checks.py" "$@"
