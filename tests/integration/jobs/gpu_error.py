"""A rank whose GPU failed, without a GPU: on the node named by the job's ``GPU_ERROR_NODE``, in the job's first
attempt, each rank prints what torch raises on an uncorrectable ECC error (c10/cuda/CUDAException.cpp:
"CUDA error: " + cudaGetErrorString(cudaErrorECCUncorrectable) + the CUDA check suffix) and exits 1; every other
rank works for ``GPU_ERROR_WORK_S`` seconds (default 4) and exits 0. No torch import: seconds, not minutes of CPU
(tests/integration/test_recovery.py)."""
import os
import sys
import time

if os.environ.get("CLUSTERCTL_NODE") == os.environ.get("GPU_ERROR_NODE") and \
        os.environ.get("CLUSTERCTL_ATTEMPT") == "1":
    print("Traceback (most recent call last):\n"
          '  File "train.py", line 88, in <module>\n'
          "    loss.backward()\n"
          "RuntimeError: CUDA error: uncorrectable ECC error encountered\n"
          "CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace below "
          "might be incorrect.\n"
          "For debugging consider passing CUDA_LAUNCH_BLOCKING=1\n"
          "Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.", file=sys.stderr, flush=True)
    sys.exit(1)
time.sleep(float(os.environ.get("GPU_ERROR_WORK_S", "4")))
print(f"gpu_error.py: rank {os.environ.get('RANK')} done", flush=True)
