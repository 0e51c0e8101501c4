"""SrunTransport with a real subprocess in srun's place (a stub that runs what follows ``--``, as srun runs the
step): output stays bounded in memory, stdin and the deadline hold, and srun's stderr is classified in linear time
(issue 34 items 4 and 10). The real srun runs in tests/integration/test_slurm.py."""
from __future__ import annotations

import time

import pytest

from clusterctl.config.inventory import Host
from clusterctl.errors import CommandTimeout, TransportError
from clusterctl.slurm import allocation as slurm
from clusterctl.transport import ConnectOptions, srun
from tests.unit.transport.bounded import assert_keeps_the_last_8_mib

# srun's options end at `--`; the step is what follows (srun's own `srun: error:` lines come on its stderr)
STUB = '#!/bin/sh\nwhile [ "$#" -gt 0 ] && [ "$1" != "--" ]; do shift; done\nshift\nexec "$@"\n'


@pytest.fixture
def transport(tmp_path, monkeypatch):
    stub = tmp_path / "srun"
    stub.write_text(STUB)
    stub.chmod(0o755)
    monkeypatch.setattr(srun, "SRUN", str(stub))
    return srun.SrunTransport(Host(name="node1", address="node1", connection="srun"),
                              ConnectOptions(command_timeout=60), env={"SLURM_JOB_ID": "7"})


def test_200_mb_of_output_keeps_the_last_8_mib_and_memory_bounded(transport):
    """srun's pipes were read with ``communicate()``: 200 MB of output took the process to 589 MiB."""
    assert_keeps_the_last_8_mib(transport, 200, 30)


def test_stdin_exit_code_and_deadline(transport):
    r = transport.run(["sh", "-c", "wc -c; exit 3"], stdin=b"z" * 3_000_000)
    assert (r.exit_code, r.stdout.strip()) == (3, "3000000")
    r = transport.run(["true"], stdin=b"never read" * 100_000)      # a command that does not read its input
    assert r.ok
    start = time.monotonic()
    with pytest.raises(CommandTimeout):
        transport.run(["sleep", "30"], timeout=0.5)
    assert time.monotonic() - start < 5


def test_step_failure_is_a_transport_error_and_srun_exit_line_is_dropped(transport):
    with pytest.raises(TransportError, match="Unable to create step"):
        transport.run(["sh", "-c", "echo 'srun: error: Unable to create step for job 7: Requested node "
                                   "configuration is not available' >&2; exit 1"])
    r = transport.run(["sh", "-c", "echo boom >&2; echo 'srun: error: node1: task 0: Exited with exit code 2' >&2;"
                                   " exit 2"])
    assert (r.exit_code, r.stderr) == (2, "boom\n")


def test_steps_export_only_the_listed_variables():
    """srun's default (--export=ALL) gave every step the supervisor's environment: secret_env values, webhook
    URLs. The argv names what a step may take; nothing else of ours reaches it (the real srun: test_slurm.py)."""
    argv = srun.srun_argv("n1", ["true"], jobid="1")
    export = [a for a in argv[: argv.index("--")] if a.startswith("--export")]
    assert export == ["--export=" + ",".join(srun.EXPORT)]
    assert "ALL" not in srun.EXPORT and "NONE" not in srun.EXPORT
    assert {"PATH", "HOME", "USER"} <= set(srun.EXPORT)


@pytest.mark.parametrize("stderr", [
    "srun: error: " + "node " * 20_000 + "\n",                           # `.*[Nn]ode.* (not|is)` backtracked
    "srun: error: " + "Node x " * 15_000 + "\n",
    ("srun: error: " + "n" * 1000 + "\n") * 100,
    "srun: error: x: task 1: " + "a:" * 50_000 + "\n",
])
def test_stderr_classification_is_linear(stderr):
    """issue 34 item 10: 39 KB of srun stderr took 1.1 s (quadratic); 100 KB now well under 0.2 s."""
    assert len(stderr) >= 100_000
    start = time.perf_counter()
    assert srun.step_failure(1, stderr) is None
    srun.command_stderr(stderr)
    assert time.perf_counter() - start < 0.2


def test_step_failure_lines_still_recognised():
    for line in ("Unable to create step for job 2: Requested node configuration is not available",
                 "Unable to confirm allocation for job 9: Invalid job id specified",
                 "Job allocation 12 has been revoked.",
                 "Invalid job id specified",
                 "Unable to allocate resources: Requested node configuration is not available",
                 "Node gpu03 is down",
                 "Requested nodes are busy; node gpu02 not in allocation",
                 "Task launch for StepId=3.4 failed on node gpu01: Slurm backup controller in standby mode",
                 "Unable to contact slurm controller (connect failure)",
                 "Application launch failed: Connection refused"):
        assert srun.step_failure(1, f"noise\nsrun: error: {line}\nmore\n") == f"srun: error: {line}", line
    assert srun.step_failure(1, "srun: error: node1: task 0: Exited with exit code 1\n") is None
    assert srun.step_failure(1, "the nodes are down\n") is None        # not srun's line


@pytest.mark.parametrize("gres", ["gpu:(" * 25_000, "gpu:" + "(" * 100_000 + "8", "gpu:8" + "(x" * 50_000])
def test_gres_gpus_is_linear(gres):
    start = time.perf_counter()
    slurm.gres_gpus(gres)
    slurm.parse_node_records("NodeName=n1 Reason=" + " w" * 50_000)
    assert time.perf_counter() - start < 0.2


@pytest.mark.parametrize("gres", ["gpu:a100:8(S:0-1)", "gpu:2(IDX:0(1)),gpu:3", "gpu(x:4", "gpu:(S:0)4",
                                  "gpu:1(a)(b:2)", "gpu:(((7"])
def test_gres_gpus_parentheses_as_the_regex_read_them(gres):
    import re

    def by_regex(gres):        # the parser before issue 34 (quadratic on an unclosed "(")
        total, seen = 0, False
        for item in gres.split(","):
            parts = re.sub(r"\(.*?\)", "", item).split(":")
            if parts[0] == "gpu":
                seen = True
                total += int(parts[-1]) if parts[-1].isdigit() else 1
        return total if seen else None
    assert slurm.gres_gpus(gres) == by_regex(gres)
