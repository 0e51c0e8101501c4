"""Golden fixtures: tests/fixtures/checks/<parser>/<case>.json = {"command", "output", "rc"?, "expected"}."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from clusterctl.checks.cluster import parse_listener, parse_peer
from clusterctl.checks.gpu import (
    parse_cuda_init,
    parse_gpu_fabric,
    parse_gpu_modes,
    parse_nvidia_smi,
    parse_nvidia_smi_list,
    parse_remapped_rows,
    parse_xid,
)
from clusterctl.checks.network import parse_ip_addr, parse_ip_link, parse_memlock, parse_rdma, parse_ss_listen
from clusterctl.checks.probe import parse_sections
from clusterctl.checks.runtime import (
    parse_cdi_list,
    parse_gpu_run,
    parse_image_inspect,
    parse_nvidia_ctk_version,
    parse_runtime_info,
)
from clusterctl.checks.storage import parse_df
from clusterctl.checks.system import parse_epoch, parse_timedatectl

PARSERS = {
    "nvidia_smi": parse_nvidia_smi, "docker_info": parse_runtime_info, "podman_info": parse_runtime_info,
    "nvidia_ctk_version": parse_nvidia_ctk_version, "cdi_list": parse_cdi_list, "image_inspect": parse_image_inspect,
    "ss_listen": parse_ss_listen, "ip_addr": parse_ip_addr, "ip_link": parse_ip_link, "df": parse_df,
    "epoch": parse_epoch, "timedatectl": parse_timedatectl, "sections": parse_sections,
    "listener": parse_listener, "peer": parse_peer, "nvidia_smi_list": parse_nvidia_smi_list, "gpu_run": parse_gpu_run,
    "gpu_modes": parse_gpu_modes, "remapped_rows": parse_remapped_rows, "gpu_fabric": parse_gpu_fabric,
    "cuda_init": parse_cuda_init, "xid": lambda output, rc=0: parse_xid(output), "rdma": parse_rdma,
    "memlock": parse_memlock,
}
ROOT = Path(__file__).resolve().parents[2] / "fixtures" / "checks"
FIXTURES = sorted(ROOT.glob("*/*.json"))


def test_every_parser_has_fixtures_and_every_fixture_a_parser():
    dirs = {p.parent.name for p in FIXTURES}
    assert dirs == set(PARSERS)


@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_parser_golden(path: Path):
    case = json.loads(path.read_text())
    assert PARSERS[path.parent.name](case["output"], case.get("rc", 0)) == case["expected"]
