"""The device run's CPU-checkable parts (issue 35, "The device run"): tests/gpu/gpu_checks.py's argument parsing,
the inventory and job it writes (loaded by clusterctl's own loaders, so a schema change breaks this test, not the
GPU run), its fixture documents, and its rank probe program run cold on CPU (gloo)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from clusterctl.checks.gpu import parse_cuda_init
from clusterctl.config import inventory
from clusterctl.config.spec import loads_job
from tests.gpu import gpu_checks as dev

ROOT = Path(__file__).resolve().parents[3]


def test_defaults_and_stage_order():
    a = dev.parse_args([])
    assert a.stages == list(dev.STAGES) and a.steps == 60 and a.budget_s == 480.0 and a.wheels is None
    a = dev.parse_args(["--stages", "job,fixtures", "--steps", "30", "--out", "/tmp/x", "--wheels", "/w"])
    assert a.stages == ["fixtures", "job"] and a.steps == 30 and a.out == "/tmp/x" and a.wheels == "/w"


@pytest.mark.parametrize("argv", [["--stages", "fixtures,nope"], ["--stages", ","], ["--steps", "10"],
                                  ["--budget-s", "5000"], ["--steps", "x"]])
def test_bad_arguments_exit_2(argv, capsys):
    with pytest.raises(SystemExit) as e:
        dev.parse_args(argv)
    assert e.value.code == 2
    assert "run_gpu_checks.sh" in capsys.readouterr().err


def test_the_inventory_it_writes_loads(tmp_path):
    path = tmp_path / "inv.yaml"
    path.write_text(yaml.safe_dump(dev.build_inventory(4)))
    [host] = inventory.load(str(path)).hosts
    assert (host.name, host.runtime, host.gpus) == ("gpu-local", "bare", 4)


def test_the_job_it_writes_loads_and_kills_after_a_checkpoint(tmp_path):
    doc = dev.build_job(tmp_path, 2, 60)
    spec = loads_job(yaml.safe_dump(doc))
    assert spec.nproc_per_node == 2 and spec.recovery == "warm" and spec.script == "train.py"
    args = doc["args"]
    kill, every = int(args[args.index("--kill-rank-at") + 1]), int(args[args.index("--checkpoint-every") + 1])
    assert every < kill < 60                  # a checkpoint exists before the kill: the relaunch resumes
    env = doc["env"]
    assert env["TORCH_NCCL_DEBUG_INFO_PIPE_FILE"].startswith(str(tmp_path))
    # the flight recorder is clusterctl's own (TORCH_FR_*): a deprecated name in env: would move the dumps elsewhere
    assert not any(k in env for k in ("TORCH_NCCL_TRACE_BUFFER_SIZE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE",
                                      "TORCH_FR_DUMP_TEMP_FILE"))
    assert spec.restarts.max_failures >= 1    # the self-kill is charged as a failure; one is allowed
    assert spec.restarts.max_restarts == 0    # no local torchrun restart: the supervisor relaunches (warm)
    assert (dev.QUICKSTART / "train.py").exists()


def test_fixture_documents_have_the_golden_shape():
    golden = json.loads((ROOT / "tests/fixtures/checks/cuda_init/ok_h100x8.json").read_text())
    doc = dev.fixture_doc("python3 -c <cuda_init program>", golden["output"], 0,
                          parse_cuda_init(golden["output"], 0), "recorded")
    assert set(golden) <= set(doc) and doc["expected"] == golden["expected"]


def test_the_rank_probe_runs_cold_on_cpu(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text(dev.RANK_PROBE)
    out = tmp_path / "cold.json"
    r = subprocess.run([sys.executable, str(probe), str(out)], capture_output=True, text=True, timeout=240,
                       env={"PATH": "/usr/bin:/bin", "CUDA_VISIBLE_DEVICES": ""})
    assert r.returncode == 0, r.stderr[-2000:]
    res = json.loads(out.read_text())
    assert res["cuda"] is False and res["bad_fork"] is False and res["allreduce"] == 1.0
    assert set(res["phases"]) == {"torch", "first_matmul", "gloo_init"}
    assert all(v >= 0 for v in res["phases"].values()) and res["total"] >= res["phases"]["torch"]


def test_the_shell_entry_point_parses_its_arguments():
    r = subprocess.run(["sh", str(ROOT / "tests/gpu/run_gpu_checks.sh"), "--help"], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0 and "--stages" in r.stdout and "--wheels" in r.stdout, r.stderr
    r = subprocess.run(["sh", str(ROOT / "tests/gpu/run_gpu_checks.sh"), "--stages", "bogus"], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 2 and "unknown stage" in r.stderr


def test_the_nccl_view_check_wants_collectives_and_gpu_memory_in_every_ranks_view(tmp_path):
    """The job stage's issue-37 check on the rank views it finds under the node's jobs root (bare, local)."""
    view = tmp_path / ".clusterctl/nodes/gpu-local/jobs/gpu-devrun-1/1/view"
    view.mkdir(parents=True)
    (view / "rank-0").write_text(json.dumps({"rank": 0, "colls": 12, "gpu_mem": 2 << 20}) + "\n")
    (view / "rank-1").write_text(json.dumps({"rank": 1, "colls": 0, "gpu_mem": 2 << 20}) + "\n")
    views = dev.read_views(tmp_path)
    assert [v["rank"] for v in views] == [0, 1]
    assert dev.nccl_view(views)[0] is False            # rank 1: no collective seen (the CPU recorder's view)
    assert dev.nccl_view(views[:1]) == (True, f"rank 0: colls 12, gpu_mem {2 << 20}")
    assert dev.nccl_view([]) == (False, "no rank view") and dev.read_views(tmp_path / "none") == []
