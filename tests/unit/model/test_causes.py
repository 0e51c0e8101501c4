"""causes: why a node's attempt ended, from recorded node output (golden fixtures)."""
from pathlib import Path

import pytest

from clusterctl.model import causes

FIX = Path(__file__).resolve().parents[2] / "fixtures" / "causes"


def text(name: str) -> str:
    return (FIX / name).read_text()


def test_root_cause_of_a_rank_killed_by_sigkill_names_rank_signal_and_pid():
    rc = causes.root_cause_of(text("torchrun_sigkill.txt"))
    assert (rc.rank, rc.exit_code, rc.pid, rc.signal) == (1, -9, 6598, "SIGKILL")
    assert causes.root_cause(text("torchrun_sigkill.txt")) == (1, -9)
    assert causes.root_cause_of("no summary") is None


def test_a_local_peer_that_raised_first_is_not_the_root_cause_the_sigkilled_rank_is():
    """Recorded in CI (test_oncall, 2026-12-04, a loaded 2-core box): rank 2 SIGKILLed, its local peer rank 3 raised
    gloo's "Connection reset by peer" first and was SIGTERMed by the agent; torchrun's Root Cause (first observed,
    by time) named rank 3, and `status` said SIGTERM. The failure list's rank that did not fail for a peer wins."""
    t = text("torchrun_peer_raised_first.txt")
    rc = causes.root_cause_of(t)
    assert (rc.rank, rc.exit_code, rc.pid, rc.signal) == (2, -9, 20, "SIGKILL")
    raw = "\n".join(line.split("] ", 1)[1] if line.startswith("[node2/") else line for line in t.splitlines())
    assert causes.root_cause_of(raw) == rc                         # torchrun's own text, without the prefixes
    # the root cause stays torchrun's when the listed failures are victims too, or none is listed
    victims = t.replace("Signal 9 (SIGKILL) received by PID 20", "RuntimeError: Connection closed by peer")
    assert causes.root_cause_of(victims).rank == 3
    stopped = t.replace("exitcode  : -9 (pid: 20)  (SIGKILL)", "exitcode  : -15 (pid: 20)  (SIGTERM)")
    assert causes.root_cause_of(stopped).rank == 3                 # SIGTERMed: the agent stopping the others
    assert causes.root_cause_of(t[t.index("Root Cause"):]).rank == 3


def test_signal_of_shell_statuses():
    assert [causes.signal_of(c) for c in (137, 143, 134, 1, None)] == ["SIGKILL", "SIGTERM", "SIGABRT", None, None]


def test_node_lines_prefix_ranks_and_drop_empty_lines():
    lines = causes.node_lines("[0]:step 1\n[1]:\n\nagent says\n[1]:  boom  \n", "n1")
    assert lines == ["[n1/0] step 1", "[n1/-] agent says", "[n1/1]   boom"]
    assert causes.error_tail(lines, "n1", 1) == "[n1/1]   boom"
    assert causes.error_tail(lines, "n1", 5) == "\n".join(lines)     # the rank printed nothing: all lines


def test_config_error_for_the_jobs_own_script_only():
    t = text("cant_open.txt")
    e = causes.config_error(1, t, script="/work/jobs/tran.py", module=None)
    assert e is not None and "tran.py" in e.message and "script:" in e.fix
    assert causes.config_error(1, t, script="tran.py", module=None) is not None      # relative script: same file
    assert causes.config_error(1, t, script="/work/jobs/train.py", module=None) is None   # another file


def test_config_error_for_exit_127_and_the_jobs_module():
    assert "127" in causes.config_error(127, "", script="train.py", module=None).message
    t = "[0]:ModuleNotFoundError: No module named 'mypkg'\n"
    assert causes.config_error(1, t, script=None, module="mypkg.train") is not None
    # a missing dependency of the job is not a config error of the job file
    assert causes.config_error(1, "[0]:ModuleNotFoundError: No module named 'numpy'\n", script=None,
                               module="mypkg.train") is None
    assert causes.config_error(1, "[0]:RuntimeError: boom\n", script="train.py", module=None) is None


def test_oom_killed_matches_the_pid_in_the_kernel_log():
    k = text("dmesg_oom.txt")
    assert causes.oom_killed(k, 6598)
    assert not causes.oom_killed(k, 6599)
    assert not causes.oom_killed("[1.0] eth0: link up\n", 6598)


def test_error_file_message():
    msg = causes.error_file_message(text("error_file.json"))
    assert msg.startswith("RuntimeError: CUDA out of memory") and "train.py" in msg
    assert causes.error_file_message("not json") is None


def test_error_file_in_reads_the_runners_copy():
    line = causes.ERROR_FILE_LINE + text("error_file.json").strip()
    log = f"[0]: step 3\n{line}\nclusterctl: torchrun exited with status 1\n"
    assert causes.error_file_in(log).startswith("RuntimeError: CUDA out of memory")
    assert causes.error_file_in("[0]: step 3\nclusterctl: torchrun exited with status 1\n") is None


@pytest.mark.parametrize("tail, peer", [
    ("RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer "
     "[10.220.0.12]:41234", True),
    ("RuntimeError: [gloo/transport/tcp/pair.cc:598] Connection reset by peer", True),
    ("torch.distributed.DistBackendError: NCCL error ... ncclRemoteError: A call failed possibly due to a network "
     "error or a remote process exiting prematurely.", True),
    ("torch.distributed.DistNetworkError: failed to recv, got 0 bytes", True),
    # NCCL's victims (torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp): the watchdog's timeout, then its abort
    ("[rank1]:[E1218 20:27:21.433063423 ProcessGroupNCCL.cpp:629] [Rank 1] Watchdog caught collective operation "
     "timeout: WorkNCCL(SeqNum=1, OpType=BROADCAST, NumelIn=131072000, NumelOut=131072000, Timeout(ms)=600000) ran "
     "for 600081 milliseconds before timing out.", True),
    ("terminate called after throwing an instance of 'c10::DistBackendError'", True),
    ("RuntimeError: NCCL communicator was aborted on rank 1.", True),
    ("ValueError: bad batch", False),
    ("", False),
])
def test_peer_failure_is_a_rank_failed_because_a_peer_went_away(tail, peer):
    assert causes.peer_failure(tail) is peer


# What a rank prints when its GPU failed: torch's "CUDA error: <cudaGetErrorString>" (c10/cuda/CUDAException.cpp,
# c10_cuda_check_implementation, with get_cuda_check_suffix) for the CUDA runtime's errors (NVIDIA CUDA Runtime API,
# enum cudaError: cudaErrorECCUncorrectable, cudaErrorLaunchFailure, cudaErrorUnknown, cudaErrorSystemNotReady = 802),
# NVML's "GPU is lost" (nvmlReturn_t NVML_ERROR_GPU_IS_LOST), NCCL's "unhandled cuda error" (ncclUnhandledCudaError).
@pytest.mark.parametrize("line, gpu", [
    ("[n3/2] RuntimeError: CUDA error: uncorrectable ECC error encountered", True),
    ("[n3/0] RuntimeError: CUDA error: unspecified launch failure", True),
    ("[n3/0] RuntimeError: CUDA error: unknown error", True),
    ("[n3/0] torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/NCCLUtils.hpp:317, "
     "unhandled cuda error (run with NCCL_DEBUG=INFO for details), NCCL version 2.21.5", True),
    ("[n3/-] Unable to determine the device handle for GPU0000:3B:00.0: GPU is lost.  Reboot the system to recover "
     "this GPU", True),
    ("[n3/0] UserWarning: CUDA initialization: Unexpected error from cudaGetDeviceCount(). Did you run some cuda "
     "functions before calling NumCudaDevices() that might have already set an error? Error 802: system not yet "
     "initialized", True),
    ("[n3/0] RuntimeError: unknown error", False),            # not the CUDA form: says nothing of a GPU
    ("[n3/0] RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB", False),   # the job's, not the GPU's
    ("[n3/0] ValueError: step 802 went wrong", False),
])
def test_gpu_error_lines(line, gpu):
    assert (causes.gpu_error(["[n3/0] step 1", line]) == line) is gpu


def test_gpu_error_in_a_torchrun_log_names_the_line():
    lines = causes.node_lines(text("torch_ecc_error.txt"), "n3")
    assert causes.gpu_error(lines) == "[n3/2] RuntimeError: CUDA error: uncorrectable ECC error encountered"


# dmesg lines in the format of NVIDIA's "Xid Errors" (docs.nvidia.com/deploy/xid-errors, "NVRM: Xid (PCI:...): N,
# pid=..., name=..., <message>"), after the node's /proc/uptime (what causes.XID_PROBE prints first).
def test_parse_xid_reads_pci_code_and_time():
    xids = causes.parse_xid(text("dmesg_xid.txt"))
    assert [(x.pci, x.code, x.uptime_s) for x in xids] == [
        ("PCI:0000:3b:00", 13, 5501.004211), ("PCI:0000:86:00", 79, 5702.881903),
        ("PCI:0000:3b:00", 13, 61201.417266), ("PCI:0000:af:00", 94, 61212.550087)]
    assert causes.parse_xid("[1.0] eth0: link up\n") == []


def test_recent_xid_only_gpu_failures_since_the_attempt_started():
    t = text("dmesg_xid.txt")            # uptime 61234: the 94 was 22 s ago, the 79 about 15.5 h ago
    x = causes.recent_xid(t, within_s=120)
    assert (x.code, x.pci) == (94, "PCI:0000:af:00")
    assert causes.recent_xid(t.replace("): 94,", "): 13,"), within_s=120) is None   # 13: the job's own fault
    assert causes.recent_xid(t, within_s=1e6).code == 94                          # the last one
    assert causes.recent_xid(t.replace("[61212.550087]", "[50000.0]"), within_s=120) is None   # an old one
    assert causes.recent_xid("", within_s=120) is None


# NCCL's own INFO lines (NCCL_DEBUG=INFO; NCCL docs, "Environment Variables", NCCL_DEBUG / NCCL_DEBUG_SUBSYS): the
# transport it chose, as src/net.cc and src/transport/net_{ib,socket}.cc print it.
def test_nccl_network_names_the_transport_nccl_chose():
    ib = ["[n1/0] n1:4242:4300 [0] NCCL INFO Bootstrap : Using eth0:10.0.0.1<0>",
          "[n1/0] n1:4242:4300 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/IB ; OOB eth0:10.0.0.1<0>",
          "[n1/0] n1:4242:4300 [0] NCCL INFO Using network IB"]
    assert causes.nccl_network(ib)[0] == "IB"
    sock = ["[n1/0] n1:4242:4300 [0] NCCL INFO NET/IB : No device found.",
            "[n1/0] n1:4242:4300 [0] NCCL INFO NET/Socket : Using [0]eth0:10.0.0.1<0>",
            "[n1/0] n1:4242:4300 [0] NCCL INFO Using network Socket"]
    transport, line = causes.nccl_network(sock)
    assert transport == "Socket" and line.endswith("Using network Socket")
    assert causes.nccl_network(sock[1:2])[0] == "Socket"        # no "Using network" line: the NET/ one
    assert causes.nccl_network(["[n1/0] step 1", "[n1/0] NCCL INFO Bootstrap : Using eth0:10.0.0.1<0>"]) is None
