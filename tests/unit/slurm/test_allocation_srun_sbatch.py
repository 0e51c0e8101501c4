"""Slurm: the pure parts (scontrol parsers, -i slurm resolution with scontrol's golden output, srun argv and
failure classification, the sbatch script). The real srun/scontrol run in tests/integration/test_slurm.py."""
from __future__ import annotations

import subprocess

import pytest

from clusterctl.errors import InputError, UserError
from clusterctl.slurm import allocation as slurm
from clusterctl.slurm import sbatch
from clusterctl.transport import srun

NODES = (
    "NodeName=gpu01 Arch=x86_64 CoresPerSocket=32  CPUAlloc=0 CPUEfctv=64 CPUTot=64 CPULoad=0.10 "
    "AvailableFeatures=(null) ActiveFeatures=(null) Gres=gpu:a100:8(S:0-1) NodeAddr=10.0.0.1 NodeHostName=gpu01 "
    "Version=22.05.8 OS=Linux 6.1.0 #1 SMP PREEMPT_DYNAMIC  RealMemory=1000 State=IDLE ThreadsPerCore=1\n"
    "NodeName=gpu02 Arch=x86_64 Gres=gpu:4,shard:8 NodeAddr=10.0.0.2 NodeHostName=gpu02 State=MIXED+DRAIN "
    "Reason=clusterctl: 3 node_lost failures [root@2026-12-02T18:00:00]\n"
    "NodeName=gpu03 Gres=(null) NodeAddr=gpu03 State=DOWN* Reason=Not responding\n"
)


def fake_run(outputs: dict):
    calls = []

    def run(argv, timeout):
        calls.append(list(argv))
        key = argv[1] if argv[1] != "-o" else "node"
        rc, out = outputs[key]
        return subprocess.CompletedProcess(argv, rc, out, "" if rc == 0 else "scontrol: error: boom")
    run.calls = calls
    return run


def test_parse_node_records_keeps_spaced_values():
    recs = slurm.parse_node_records(NODES)
    assert recs["gpu01"]["OS"] == "Linux 6.1.0 #1 SMP PREEMPT_DYNAMIC"
    assert recs["gpu02"]["Reason"].startswith("clusterctl: 3 node_lost failures")
    assert recs["gpu03"]["State"] == "DOWN*"


@pytest.mark.parametrize("gres,want", [("gpu:8", 8), ("gpu:a100:8(S:0-1)", 8), ("gpu:4,shard:8", 4),
                                       ("gpu:a100:2,gpu:v100:2", 4), ("(null)", None), ("", None),
                                       ("shard:8", None)])
def test_gres_gpus(gres, want):
    assert slurm.gres_gpus(gres) == want


def test_drained_nodes():
    assert slurm.drained(slurm.parse_node_records(NODES)) == {"gpu02", "gpu03"}


def test_drain_argv_is_one_line_and_bounded():
    argv = slurm.drain_argv("gpu02", "two\nlines  " + "x" * 500)
    assert argv[:4] == ["scontrol", "update", "NodeName=gpu02", "State=DRAIN"]
    assert argv[4].startswith("Reason=clusterctl: two lines ") and "\n" not in argv[4] and len(argv[4]) < 230


def test_inventory_from_allocation_with_overlay(tmp_path):
    ov = tmp_path / "overlay.yaml"
    ov.write_text("all:\n  vars:\n    clusterctl_runtime: podman\n  hosts:\n    gpu02:\n      clusterctl_gpus: 2\n")
    run = fake_run({"show": (0, "gpu02\ngpu01\n"), "node": (0, NODES)})
    inv = slurm.load_inventory(f"slurm:{ov}", {"SLURM_JOB_NODELIST": "gpu[01-02]", "SLURM_JOB_ID": "7"}, run)
    assert [h.name for h in inv.hosts] == ["gpu02", "gpu01"]            # allocation order
    assert [(h.address, h.connection, h.runtime, h.gpus) for h in inv.hosts] == \
        [("10.0.0.2", "srun", "podman", 2), ("10.0.0.1", "srun", "podman", 8)]
    assert inv.source == f"slurm job 7 + {ov}"
    assert run.calls[0] == ["scontrol", "show", "hostnames", "gpu[01-02]"]


def test_inventory_gpus_on_node_wins_over_gres():
    run = fake_run({"show": (0, "gpu01\n"), "node": (0, NODES)})
    inv = slurm.load_inventory("slurm", {"SLURM_JOB_NODELIST": "gpu01", "SLURM_GPUS_ON_NODE": "2"}, run)
    assert inv.hosts[0].gpus == 2


def test_inventory_errors(tmp_path):
    with pytest.raises(UserError, match="SLURM_JOB_NODELIST is not set"):
        slurm.load_inventory("slurm", {}, fake_run({}))
    ov = tmp_path / "o.yaml"
    ov.write_text("all:\n  hosts:\n    gpu09: {}\n")
    with pytest.raises(InputError) as e:
        slurm.load_inventory(f"slurm:{ov}", {"SLURM_JOB_NODELIST": "gpu01"},
                             fake_run({"show": (0, "gpu01\n"), "node": (0, NODES)}))
    assert e.value.exit_code == 2 and ":3" in str(e.value) and "not in the allocation" in str(e.value)
    ov.write_text("all:\n  vars:\n    clusterctl_gpus: many\n")
    with pytest.raises(InputError, match=":3"):
        slurm.load_inventory(f"slurm:{ov}", {"SLURM_JOB_NODELIST": "gpu01"},
                             fake_run({"show": (0, "gpu01\n"), "node": (0, NODES)}))
    with pytest.raises(UserError, match="boom"):
        slurm.load_inventory("slurm", {"SLURM_JOB_NODELIST": "gpu01"}, fake_run({"show": (1, "")}))


def test_srun_argv():
    assert srun.srun_argv("gpu01", ["sh", "-c", "echo $1", "sh", "a b"], jobid="42") == [
        "srun", "--overlap", "--nodes=1", "--ntasks=1", "-w", "gpu01", "--quiet", "--kill-on-bad-exit=0",
        "--export=" + ",".join(srun.EXPORT), "--jobid=42", "--", "sh", "-c", "echo $1", "sh", "a b"]
    assert "--jobid" not in " ".join(srun.srun_argv("n", ["true"], jobid=None))
    assert srun.job_id({"SLURM_JOB_ID": "12"}) == "12" and srun.job_id({"SLURM_JOB_ID": "x;y"}) is None


def test_srun_step_failure_vs_command_exit():
    assert srun.step_failure(1, "srun: error: Unable to create step for job 2: Requested node configuration is "
                                "not available\n")
    assert srun.step_failure(1, "srun: error: gpu01: task 0: Exited with exit code 1\n") is None
    assert srun.step_failure(0, "srun: error: Unable to create step") is None
    assert srun.command_stderr("boom\nsrun: error: node2: task 0: Exited with exit code 3\n") == "boom\n"


def test_sbatch_script():
    s = sbatch.BatchScript(job_path="/j/job.yaml", job_name="demo", nodes="2-4", state_dir="/shared/st",
                           inventory="slurm:/j/o.yaml", python="/venv/bin/python", signal_s=300,
                           sbatch_args=("--time=1:00:00",))
    text = s.render()
    assert text.startswith("#!/bin/bash\n")
    for line in ("#SBATCH --nodes=2-4", "#SBATCH --requeue", "#SBATCH --signal=B:USR1@300",
                 "#SBATCH --output=/shared/st/slurm/%x-%j.out", 'scontrol requeue "${SLURM_JOB_ID}"',
                 "/venv/bin/python -m clusterctl.cli --state-dir /shared/st sbatch-run /j/job.yaml -i "
                 "slurm:/j/o.yaml &"):
        assert line in text, line
    assert "--no-kill" not in text      # with it, a dead batch host left a job with nothing running (Slurm 22.05)
    assert s.sbatch_argv("/x.sbatch") == ["sbatch", "--parsable", "--time=1:00:00", "/x.sbatch"]
    assert sbatch.restart_count({"SLURM_RESTART_COUNT": "2"}) == 2 and sbatch.restart_count({}) == 0
