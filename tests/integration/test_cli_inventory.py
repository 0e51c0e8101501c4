"""`clusterctl inventory` on a real testbed inventory: the CLI process as a user runs it, JSON on stdout."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from clusterctl.config import inventory
from clusterctl.transport import ConnectOptions, connect, fan_out
from tests.testbed import profile

N_HOSTS = 4


def clusterctl(*args: str, env: dict | None = None, cwd=None) -> subprocess.CompletedProcess:
    script = Path(sys.executable).parent / "clusterctl"
    cmd = [str(script)] if script.exists() else [sys.executable, "-c", "from clusterctl.cli import main; main()"]
    return subprocess.run(cmd + list(args), capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL,
                          env=env, cwd=cwd)


@pytest.fixture
def tb(make_testbed):
    return make_testbed(N_HOSTS, [profile(gpus=2, image=False)] * 2 + [profile(gpus=0, image=False)] * 2)


def test_inventory_json_has_hosts_addresses_and_vars(tb, tmp_path):
    path = tb.inventory(tmp_path / "inventory.yaml", runtime="podman", extra_vars={"site": "lab-a"})
    r = clusterctl("inventory", "-i", str(path), "--output", "json")
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert data["source"] == str(path)
    assert [h["name"] for h in data["hosts"]] == [h.name for h in tb.hosts]
    assert data["groups"]["all"] == [h.name for h in tb.hosts]
    for got, want in zip(data["hosts"], tb.hosts):
        assert got["address"] == want.address
        assert got["port"] == 22
        assert got["user"] == tb.user
        assert got["key_file"] == str(tb.key)
        assert got["known_hosts"] == str(tb.known_hosts)
        assert got["connection"] == "ssh"
        assert got["runtime"] == "podman"
        assert got["interface"] == "eth0"
        assert got["gpus"] == want.profile["gpus"]  # host var (profiles differ, so set per host)
        assert got["groups"] == ["all"]
        assert got["vars"]["site"] == "lab-a"   # a free-form group var reaches every host
        assert got["vars"]["ansible_host"] == want.address
        assert got["vars"]["clusterctl_runtime"] == "podman"
    assert [h["gpus"] for h in data["hosts"]] == [2, 2, 0, 0]


def test_inventory_groups_and_precedence(tb, tmp_path):
    """Child-group vars override `all` vars; host vars override both."""
    base = yaml.safe_load(tb.inventory(tmp_path / "base.yaml").read_text())
    hv = base["all"]["hosts"]
    names = list(hv)
    hv[names[3]]["clusterctl_runtime"] = "bare"
    doc = {"all": {"vars": base["all"]["vars"],
                   "children": {"gpu": {"hosts": {n: hv[n] for n in names[:2]}, "vars": {"clusterctl_runtime": "docker"}},
                                "cpu": {"hosts": {n: hv[n] for n in names[2:]}}}}}
    path = tmp_path / "groups.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    r = clusterctl("inventory", "-i", str(path), "-o", "json")
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert data["groups"]["gpu"] == names[:2] and data["groups"]["cpu"] == names[2:]
    assert [h["runtime"] for h in data["hosts"]] == ["docker", "docker", "podman", "bare"]
    assert [h["address"] for h in data["hosts"]] == [h.address for h in tb.hosts]


def test_inventory_from_env_and_table_output(tb, tmp_path):
    path = tb.inventory(tmp_path / "inv.yaml")
    # rich wraps/truncates cells to 80 columns when stdout is not a terminal; give it room
    env = dict(os.environ, CLUSTERCTL_INVENTORY=str(path), COLUMNS="200")
    r = clusterctl("inventory", env=env, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    for h in tb.hosts:
        assert h.name in r.stdout and h.address in r.stdout
    assert str(path) in r.stdout.replace("\n", "")


def test_inventory_error_is_file_line_and_exit_2(tb, tmp_path):
    path = tb.inventory(tmp_path / "bad.yaml", extra_vars={"ansible_prot": 22})
    line = next(i for i, ln in enumerate(path.read_text().splitlines(), 1) if "ansible_prot" in ln)
    r = clusterctl("inventory", "-i", str(path), "-o", "json")
    assert r.returncode == 2
    assert r.stdout == ""
    assert f"{path}:{line}" in r.stderr and "ansible_port" in r.stderr
    assert "Traceback" not in r.stderr


def test_resolved_inventory_reaches_every_host(tb, tmp_path):
    """What `inventory` resolves is what the transports use: every host answers with its own name."""
    path = tb.inventory(tmp_path / "inventory.yaml")
    hosts = inventory.load(str(path)).hosts
    opts = ConnectOptions(connect_timeout=3, known_hosts=str(tmp_path / "user_known_hosts"),
                          ssh_config=str(tmp_path / "no_ssh_config"))

    def hostname(h):
        t = connect(h, opts)
        try:
            return t.run(["hostname"]).stdout.strip()
        finally:
            t.close()

    rs = fan_out(list(hosts), hostname, host_timeout=20)
    assert [(r.host.name, r.value, r.error) for r in rs] == [(h.name, h.name, None) for h in tb.hosts]
