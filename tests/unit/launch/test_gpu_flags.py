"""GPU flags chosen from what preflight gathers (issue 12, part 4): `--gpus=all` where docker has the nvidia
runtime, CDI (`--device=nvidia.com/gpu=all`) where a CDI spec exists and the runtime reads it (podman; docker >= 25
with CDI enabled), a nvidia_toolkit failure with the fix where neither. Golden: recorded `docker info` /
`nvidia-ctk cdi list` outputs (tests/fixtures/checks) -> the choice -> the `run` argv."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from clusterctl.checks.runtime import choose_gpu_flags, parse_cdi_list, parse_runtime_info  # noqa: E402
from clusterctl.config.inventory import Host  # noqa: E402
from clusterctl.config.spec import loads_job  # noqa: E402
from clusterctl.launch.plan import build_plan  # noqa: E402
from tests.unit.checks.test_preflight import check, cluster, run  # noqa: E402

FIX = Path(__file__).resolve().parents[2] / "fixtures" / "checks"
GPUS, CDI = "--gpus=all", "--device=nvidia.com/gpu=all"


def fixture(kind: str, case: str) -> tuple[str, int]:
    d = json.loads((FIX / kind / f"{case}.json").read_text())
    return d["output"], d.get("rc", 0)


# (runtime, docker_info/podman_info case, cdi_list case) -> flags
GOLDEN = [
    ("docker", "docker_info/daemon_up_with_nvidia_runtime", "cdi_list/none", "gpus"),
    ("docker", "docker_info/daemon_up_with_nvidia_runtime", "cdi_list/eight_gpus", "gpus"),   # the seeds' way
    ("docker", "docker_info/docker27_cdi_enabled", "cdi_list/eight_gpus", "cdi"),
    ("docker", "docker_info/docker27_cdi_enabled", "cdi_list/none", None),       # CDI on, no spec
    ("docker", "docker_info/daemon_up_without_nvidia_runtime", "cdi_list/eight_gpus", None),   # CDI off
    ("docker", "docker_info/podman_behind_docker_shim", "cdi_list/eight_gpus", "cdi"),
    ("podman", "podman_info/podman43_root_real", "cdi_list/eight_gpus", "cdi"),
    ("podman", "podman_info/podman43_root_real", "cdi_list/none", None),
]


@pytest.mark.parametrize("rt,info_case,cdi_case,want", GOLDEN, ids=lambda v: str(v).split("/")[-1])
def test_choice_from_recorded_outputs(rt, info_case, cdi_case, want):
    info = parse_runtime_info(*fixture(*info_case.split("/")))
    cdi = parse_cdi_list(*fixture(*cdi_case.split("/")))
    assert choose_gpu_flags(info, cdi["gpus"]) == want

    hosts, fakes = cluster(1, runtime=rt, node1={"sections": {"runtime_info": fixture(*info_case.split("/")),
                                                               "cdi_list": fixture(*cdi_case.split("/"))}})
    report = run(hosts, fakes)[0]
    c = check(report, "node1", "nvidia_toolkit")
    if want is None:
        assert c.status == "fail", c
        assert "nvidia-ctk" in c.hint
        if info["flavor"] == "docker":      # both ways out, each with its commands
            assert "nvidia-ctk runtime configure --runtime=docker" in c.hint and '"cdi": true' in c.hint
            assert "nvidia-ctk cdi generate" in c.hint
        assert report.gpu_flags() == {}
        return
    assert c.status in ("pass", "warn"), c
    assert c.data["gpu_flags"] == want
    assert report.gpu_flags() == {"node1": want}
    argv = build_plan(loads_job("name: a\nscript: t.py\n"),
                      [Host(name="node1", address="10.0.0.1", runtime=rt, gpus=8)], job_id="a1", attempt=0,
                      gpu_flags=report.gpu_flags()).nodes[0].runtime_argv
    flag = {"gpus": GPUS, "cdi": CDI}[want]
    other = CDI if flag == GPUS else GPUS
    assert flag in argv and other not in argv


def test_cdi_needs_docker_25():
    out, rc = fixture("docker_info", "docker27_cdi_enabled")
    doc = json.loads(out)
    doc["ServerVersion"] = "24.0.7"            # a CDISpecDirs field from an older daemon does not count
    assert parse_runtime_info(json.dumps(doc), rc)["cdi"] is False
    doc["ServerVersion"], doc["CDISpecDirs"] = "26.1.0", []      # 25+ with the feature off: an empty list
    assert parse_runtime_info(json.dumps(doc), rc)["cdi"] is False


@pytest.mark.parametrize("rt,flags,want", [
    ("docker", None, GPUS), ("docker", "gpus", GPUS), ("docker", "cdi", CDI),
    ("podman", None, CDI), ("podman", "cdi", CDI), ("podman", "gpus", CDI),    # podman 4 has no --gpus
])
def test_run_argv_per_flags(rt, flags, want):
    spec = loads_job("name: a\nscript: t.py\n")
    hosts = [Host(name="n1", address="10.0.0.1", runtime=rt, gpus=8)]
    argv = build_plan(spec, hosts, job_id="a1", attempt=0,
                      gpu_flags={"n1": flags} if flags else None).nodes[0].runtime_argv
    assert [a for a in argv if a in (GPUS, CDI)] == [want]
    cpu = build_plan(spec, [Host(name="n1", address="10.0.0.1", runtime=rt, gpus=0)], job_id="a1", attempt=0,
                     gpu_flags={"n1": "cdi"}).nodes[0].runtime_argv
    assert GPUS not in cpu and CDI not in cpu


def test_the_choice_is_recorded_with_the_job_and_used_by_every_attempt():
    from clusterctl.model.record import JobRecord

    spec = loads_job("name: a\nscript: t.py\n")
    rec = JobRecord(spec=spec, source="/j.yaml", hosts=(Host(name="n1", address="10.0.0.1", runtime="docker"),),
                    gpu_flags={"n1": "cdi"})
    assert JobRecord.from_json(rec.to_json()).gpu_flags == {"n1": "cdi"}
    old = json.loads(rec.to_json())
    del old["gpu_flags"]                                   # a record written before the field existed
    assert JobRecord.from_json(json.dumps(old)).gpu_flags == {}
