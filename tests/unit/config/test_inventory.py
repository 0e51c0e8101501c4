"""Inventory parsing against golden fixtures: tests/fixtures/inventory/{ok,errors}.

ok/<case>.yaml resolves to ok/<case>.json (regenerate with UPDATE_GOLDEN=1 after checking the diff);
errors/<case>.yaml must fail with exactly the message in EXPECTED_ERRORS (file:line: message).
"""
import json
import os
import re
from pathlib import Path

import pytest

from clusterctl.config import inventory
from clusterctl.errors import InputError

FIX = Path(__file__).parent.parent.parent / "fixtures" / "inventory"
OK = sorted((FIX / "ok").glob("*.yaml"))


def resolved(inv):
    return {"hosts": [{k: v for k, v in h.to_dict().items()} for h in inv.hosts],
            "groups": {g: list(v) for g, v in inv.groups.items()}}


@pytest.mark.parametrize("path", OK, ids=[p.stem for p in OK])
def test_golden(path):
    got = resolved(inventory.parse(str(path)))
    golden = path.with_suffix(".json")
    if os.environ.get("UPDATE_GOLDEN") or not golden.exists():
        golden.write_text(json.dumps(got, indent=2) + "\n")
    assert got == json.loads(golden.read_text())


EXPECTED_ERRORS = {
    "unknown_var": "5: clusterctl_gpu: unknown variable (did you mean 'clusterctl_gpus'?)",
    "bad_type": "3: ansible_port: must be integer, got str '22'",
    "duplicate_host": "5: duplicate key 'a'",
    "malformed": "4: malformed YAML",
    "bad_runtime": "5: clusterctl_runtime: must be one of docker, podman, bare, got 'kubernetes'",
    "port_range": "3: ansible_port: port out of range 1..65535: 70000",
    "empty": "inventory is empty",
    "no_hosts": "1: inventory defines no hosts",
    "bad_group_key": "4: unknown key 'host' in group 'gpu' (did you mean 'hosts'?)",
    "range_overlap": "4: duplicate host 'gpu02' in group 'all'",
    "bad_hostname": "3: invalid host name 'a;rm -rf /'",
    "host_is_group": "3: name 'gpu' is both a host and a group",
    "leading_dash": "4: ansible_host: invalid value '-oProxyCommand=touch /tmp/pwned'",
    "top_list": "1: inventory must be a mapping",
}


def test_every_error_fixture_has_an_expectation():
    assert {p.stem for p in (FIX / "errors").glob("*.yaml")} == set(EXPECTED_ERRORS)


@pytest.mark.parametrize("case", sorted(EXPECTED_ERRORS))
def test_errors_name_file_and_line(case):
    path = str(FIX / "errors" / f"{case}.yaml")
    with pytest.raises(InputError) as e:
        inventory.parse(path)
    assert str(e.value).startswith(f"{path}:"), str(e.value)
    assert EXPECTED_ERRORS[case] in str(e.value)
    assert e.value.exit_code == 2


def test_precedence_host_over_child_over_parent_over_all():
    inv = inventory.parse(str(FIX / "ok" / "groups.yaml"))
    g1, g2, g4, b = (inv.get(n) for n in ("gpu01", "gpu02", "gpu04", "bastion"))
    assert (g1.interface, g1.port, g1.address, g1.gpus) == ("eth1", 2200, "10.0.0.1", 8)  # child group wins
    assert (g2.interface, g2.port, g2.address) == ("ib0", None, "gpu02")                  # parent group
    assert g4.gpus == 4                                                                   # host var wins
    assert (b.gpus, b.runtime, b.user) == (0, "bare", "root")                             # all vars
    assert inv.select(["rack1", "login", "gpu01"]) == [g1, b]


def test_ranges():
    inv = inventory.parse(str(FIX / "ok" / "ranges.yaml"))
    assert [h.name for h in inv.hosts] == ["node1", "node2", "node3", "racka-08", "racka-10", "rackb-08", "rackb-10"]
    assert inv.get("rackb-10").user == "ops"


def test_a_large_range_parses_in_linear_time():
    """A group's host list was a list searched per host (O(N^2)): `n[1:99999]` took 268 s. 40,000 hosts in two
    groups now take well under a second of CPU; the bound is loose (a loaded 2-core box), a quadratic parse
    needs minutes."""
    import time

    t0 = time.process_time()
    inv = inventory.parse_data({"all": {"hosts": {"n[1:40000]": None},
                                        "children": {"rack": {"hosts": {"n[1:40000]": {"ansible_port": 2222}}}}}},
                               "big.yaml")
    took = time.process_time() - t0
    assert len(inv.hosts) == 40000 and len(inv.groups["rack"]) == 40000
    assert inv.get("n40000").port == 2222 and [h.name for h in inv.hosts[:2]] == ["n1", "n2"]
    assert took < 15, f"{took:.1f} s of CPU for 40,000 hosts"


def test_default_when_nothing_given(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("CLUSTERCTL_INVENTORY", raising=False)
    inv = inventory.load(None)
    assert [(h.name, h.connection, h.runtime) for h in inv.hosts] == [("localhost", "local", "bare")]
    (tmp_path / "inventory.yaml").write_text("all:\n  hosts:\n    here:\n")
    assert inventory.load(None).hosts[0].name == "here"
    (tmp_path / "env.yaml").write_text("all:\n  hosts:\n    fromenv:\n")
    monkeypatch.setenv("CLUSTERCTL_INVENTORY", str(tmp_path / "env.yaml"))
    assert inventory.load(None).hosts[0].name == "fromenv"


def test_load_takes_a_path_object(tmp_path):
    """A pathlib.Path is a file, never the ``slurm`` source (a Path has no startswith: it raised)."""
    (tmp_path / "slurm").write_text("all:\n  hosts:\n    fromfile:\n")
    assert inventory.load(tmp_path / "slurm").hosts[0].name == "fromfile"


def test_shipped_examples_parse():
    root = Path(__file__).parent.parent.parent.parent / "inventories"
    files = sorted(root.glob("*.yaml"))
    assert {f.name for f in files} >= {"local.yaml", "gpu-cluster.yaml"}
    for f in files:
        assert inventory.parse(str(f)).hosts


# ------------------------------------------------------------------ issue 11: addresses and jump hosts
@pytest.mark.parametrize("value", ["*", "*.corp", "a,b", "a?", "!a", "'a'", '"a"', "$(id)", "a;b", "[::1]",
                                   "a b", "10.0.0.1:22", "fe80::1%$(x)", "a/b", "-x", "a..b"])
def test_ansible_host_must_be_a_name_or_ip(tmp_path, value):
    f = tmp_path / "inv.yaml"
    f.write_text("all:\n  hosts:\n    node1:\n      ansible_host: " + json.dumps(value) + "\n")
    with pytest.raises(InputError) as e:
        inventory.parse(str(f))
    assert e.value.line == 4 and e.value.key == "ansible_host", e.value


@pytest.mark.parametrize("value", ["node1", "gpu-01.corp.example", "10.0.0.1", "::1", "fe80::1%eth0", "a_b.c"])
def test_ansible_host_names_and_ips_accepted(tmp_path, value):
    f = tmp_path / "inv.yaml"
    f.write_text("all:\n  hosts:\n    node1:\n      ansible_host: " + json.dumps(value) + "\n")
    assert inventory.parse(str(f)).hosts[0].address == value


@pytest.mark.parametrize("value,needle", [("bastion:abc", "port 'abc'"), ("bastion:0", "port '0'"),
                                          ("::1", "brackets"), ("[::1", "IPv6"), ("*.corp", "not a host name"),
                                          ("u;x@bastion", "invalid user"), ("ssh://bastion", "URI"),
                                          ("a,b,c,d,e", "at most 4"), ("a,,b", "not a host name")])
def test_proxy_jump_validated(tmp_path, value, needle):
    f = tmp_path / "inv.yaml"
    f.write_text("all:\n  vars:\n    clusterctl_proxy_jump: " + json.dumps(value) + "\n  hosts:\n    n1:\n")
    with pytest.raises(InputError) as e:
        inventory.parse(str(f))
    assert e.value.line == 3 and e.value.key == "clusterctl_proxy_jump" and needle in str(e.value), e.value


def test_proxy_jump_forms():
    J = inventory.Jump
    assert inventory.parse_proxy_jump("bastion") == [J(None, "bastion", None)]
    assert inventory.parse_proxy_jump("u@[::1]:2222") == [J("u", "::1", 2222)]
    assert inventory.parse_proxy_jump("a@b:22,c") == [J("a", "b", 22), J(None, "c", None)]
    assert str(J("u", "::1", 2222)) == "u@[::1]:2222" and str(J(None, "b", None)) == "b"


def test_a_thousand_ranges_in_one_host_pattern_expand_without_recursion():
    from clusterctl.config.inventory import expand_range

    assert expand_range("n" + "[0:1]" * 10) == [f"n{i:010b}" for i in range(1024)]
    assert expand_range("n" + "[0:0]" * 1000) == ["n" + "0" * 1000]     # was RecursionError (exit 1)


@pytest.mark.parametrize("pattern,message", [("n[0:10:0]", "the step must be at least 1"),
                                             ("n[5:1]", "empty range"), ("n[a:3]", "bad range")])
def test_bad_ranges_are_clear_errors(pattern, message):
    from clusterctl.config.inventory import expand_range

    with pytest.raises(ValueError, match=re.escape(message)):
        expand_range(pattern)


def test_relative_known_hosts_is_relative_to_the_inventory_file(tmp_path, monkeypatch):
    """Issue 24 item 10: ``clusterctl_known_hosts: keys/kh`` names the file next to the inventory, wherever
    clusterctl runs from (absolute and ``~`` paths are kept)."""
    d = tmp_path / "site"
    d.mkdir()
    (d / "inv.yaml").write_text("all:\n  hosts:\n    n1: {clusterctl_known_hosts: keys/kh}\n"
                                "    n2: {clusterctl_known_hosts: /etc/kh}\n    n3: {clusterctl_known_hosts: ~/kh}\n")
    monkeypatch.chdir(tmp_path)
    inv = inventory.parse("site/inv.yaml")
    assert [h.known_hosts for h in inv.hosts] == [str(d / "keys" / "kh"), "/etc/kh", "~/kh"]
