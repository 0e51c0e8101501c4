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
    ("ValueError: bad batch", False),
    ("", False),
])
def test_peer_failure_is_a_rank_failed_because_a_peer_went_away(tail, peer):
    assert causes.peer_failure(tail) is peer
