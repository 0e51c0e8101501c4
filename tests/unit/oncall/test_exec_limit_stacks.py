"""exec grouping and exit codes, --limit patterns, the supervisor's stacks on a hang, status showing them."""
from __future__ import annotations

import pytest

from clusterctl.config import hostpattern
from clusterctl.config.inventory import Host, Inventory
from clusterctl.errors import ConnectError, UserError
from clusterctl.model.verdicts import Observation
from clusterctl.oncall import remote_exec
from clusterctl.oncall.remote_exec import ExecResult
from clusterctl.store.state import JobState, Store
from clusterctl.supervise.supervisor import Policy, Supervisor
from clusterctl.transport import CommandResult, ConnectOptions
from clusterctl.views import status
from tests.unit.supervise.test_supervisor import FakeOps

R = "running"


def inv() -> Inventory:
    hosts = tuple(Host(name=n, address=f"10.0.0.{i}", groups=g) for i, (n, g) in enumerate([
        ("gpu1", ("all", "train")), ("gpu2", ("all", "train")), ("gpu10", ("all",)), ("login", ("all", "infra"))]))
    return Inventory("inv.yaml", hosts, {"all": tuple(h.name for h in hosts), "train": ("gpu1", "gpu2"),
                                         "infra": ("login",)})


@pytest.mark.parametrize("pattern,want", [
    (None, ["gpu1", "gpu2", "gpu10", "login"]),
    ("login,gpu1", ["gpu1", "login"]),                    # inventory order, not pattern order
    ("train", ["gpu1", "gpu2"]),
    ("gpu?", ["gpu1", "gpu2"]),
    ("gpu*", ["gpu1", "gpu2", "gpu10"]),
    ("gpu[1:2]", ["gpu1", "gpu2"]),                  # the inventory's range syntax (issue 27 item 6)
    ("inf*", ["login"]),                                  # globs match group names too
    ("train, gpu1 ,login", ["gpu1", "gpu2", "login"]),
])
def test_limit(pattern, want):
    assert [h.name for h in hostpattern.select(inv(), pattern)] == want


@pytest.mark.parametrize("pattern", ["", " ", " , "])
def test_an_empty_limit_is_a_usage_error_not_every_host(pattern):
    with pytest.raises(UserError, match="is empty"):            # an unset variable must not widen the scope
        hostpattern.select(inv(), pattern)


def test_limit_that_matches_nothing_is_a_usage_error():
    with pytest.raises(UserError, match=r"'gpu9' matches no host or group of inv.yaml .*groups: train, infra"):
        hostpattern.select(inv(), "gpu1,gpu9")


def r(host, code=0, out="", err="", error=None):
    return ExecResult(host, code, out, err, error)


def test_group_collapses_identical_results_in_host_order():
    res = [r("a", out="x\n"), r("b", out="y\n"), r("c", out="x\n"), r("d", None, error="unreachable"),
           r("e", out="x\n", err="w\n")]
    groups = remote_exec.group(res)
    assert [hosts for hosts, _ in groups] == [["a", "c"], ["b"], ["d"], ["e"]]
    text = remote_exec.render(res)
    assert text.splitlines()[:4] == [remote_exec.RULE, "a,c (2 hosts): exit 0", remote_exec.RULE, "x"]
    assert "d (1 host): error: unreachable" in text and "[stderr] w" in text
    assert text.endswith("4/5 host(s) exited 0")


@pytest.mark.parametrize("results,code", [
    ([r("a"), r("b")], 0), ([r("a"), r("b", 2)], 1), ([r("a"), r("b", None, error="x")], 1), ([], 1)])
def test_exit_code(results, code):
    assert remote_exec.exit_code(results) == code


class FakeTransport:
    def __init__(self, host):
        self.host, self.closed = host, False

    def run(self, argv, timeout=None, stdin=None):
        if self.host.name == "bad":
            raise ConnectError("bad", "connect to 10.0.0.9:22 timed out after 5s")
        return CommandResult(tuple(argv), 0 if self.host.name != "fail" else 3, " ".join(argv), "", 0.01)

    def close(self):
        self.closed = True


def test_run_returns_a_value_per_host_with_the_wrapped_argv():
    hosts = [Host(name=n, address="x") for n in ("ok", "fail", "bad")]
    res = remote_exec.run(hosts, ["echo", "a b"], connect=lambda h, o: FakeTransport(h), options=ConnectOptions(),
                          timeout=5, wrap=lambda h, argv: ["podman", "exec", f"c-{h.name}", *argv])
    assert [x.to_dict() for x in res] == [
        {"host": "ok", "exit_code": 0, "stdout": "podman exec c-ok echo a b", "stderr": "", "error": None},
        {"host": "fail", "exit_code": 3, "stdout": "podman exec c-fail echo a b", "stderr": "", "error": None},
        {"host": "bad", "exit_code": None, "stdout": "", "stderr": "",
         "error": "connect to 10.0.0.9:22 timed out after 5s"}]


# ------------------------------------------------------------------------------------------------ hang -> stacks
class StackOps(FakeOps):
    def __init__(self, *a, fail=False, **kw):
        super().__init__(*a, **kw)
        self.calls, self.fail = [], fail

    def stacks(self, attempt, nodes):
        self.calls.append((attempt, tuple(nodes), len(self.stopped)))
        if self.fail:
            raise RuntimeError("py-spy exploded")
        return "ranks 0-2: all_reduce \u2190 train_step train.py:88\nrank 3: load_batch data.py:40"


@pytest.fixture
def store(tmp_path):
    s = Store(tmp_path / "state.db")
    yield s
    s.close()


def hang_run(store, ops):
    job_id = store.create_job("demo", "{}", None, None)
    quiet = [Observation("a", R), Observation("b", R)]
    ops.script.extend([quiet] * 10)
    pol = Policy(min_nodes=2, max_nodes=2, backoff_s=0, hang_timeout_s=3, max_node_failures=0)
    sup = Supervisor(job_id, store, ops, pol, ["a", "b"], clock=iter(range(10**6)).__next__, sleep=lambda s: None)
    return job_id, sup.run()


def test_a_hang_takes_the_stacks_before_stopping_anything(store):
    ops = StackOps([])
    job_id, state = hang_run(store, ops)
    assert state == JobState.FAILED
    assert ops.calls == [(1, ("a", "b"), 0)]                   # nothing was stopped yet when they were taken
    kinds = [e.kind for e in store.events(job_id)]
    assert kinds.index("verdict") < kinds.index("stacks") < kinds.index("gang_stop")
    view = status.job_view(store, store.get_job(job_id))
    [f] = view["failures"]
    assert f["class"] == "hang"
    assert f["stacks"] == ["ranks 0-2: all_reduce \u2190 train_step train.py:88", "rank 3: load_batch data.py:40"]


def test_stacks_that_fail_do_not_stop_the_recovery(store):
    ops = StackOps([], fail=True)
    job_id, state = hang_run(store, ops)
    assert state == JobState.FAILED and ops.stopped
    [e] = [e for e in store.events(job_id) if e.kind == "stacks"]
    assert e.message == "could not take the stacks: py-spy exploded"


def test_ops_without_stacks_and_other_failures_have_none(store):
    ops = FakeOps([])
    job_id, _ = hang_run(store, ops)
    assert "stacks" not in [e.kind for e in store.events(job_id)]
    assert status.job_view(store, store.get_job(job_id))["failures"][0]["stacks"] is None


# ------------------------------------------------------------------------------------------------ fabric policy
@pytest.fixture(scope="module")
def keys():
    import paramiko

    return paramiko.RSAKey.generate(1024), paramiko.RSAKey.generate(1024)


def test_fabric_policy_refuses_unknown_and_changed_keys(tmp_path, keys):
    import paramiko

    from clusterctl.fabric import HostKeyPolicy, RefusedHostKey

    k1, k2 = keys
    user_kh, inv_kh = tmp_path / "known_hosts", tmp_path / "inv_known_hosts"
    user_kh.write_text("")
    inv_kh.write_text(f"[10.0.0.1]:2222 {k1.get_name()} {k1.get_base64()}\n")
    pol = HostKeyPolicy("n1", [str(user_kh), str(inv_kh)], str(inv_kh))
    pol.missing_host_key(None, "[10.0.0.1]:2222", k1)                      # known (in clusterctl_known_hosts)
    with pytest.raises(RefusedHostKey, match="unknown host key for 10.0.0.2") as ei:
        pol.missing_host_key(None, "10.0.0.2", k1)
    assert isinstance(ei.value, paramiko.SSHException)
    with pytest.raises(RefusedHostKey, match=r"HOST KEY CHANGED .*inv_known_hosts:1"):
        pol.missing_host_key(None, "[10.0.0.1]:2222", k2)
    accept = HostKeyPolicy("n2", [str(user_kh), str(inv_kh)], str(inv_kh), accept_new=True)
    accept.missing_host_key(None, "10.0.0.2", k2)                          # recorded, like accept-new
    assert inv_kh.read_text().splitlines()[-1] == f"10.0.0.2 {k2.get_name()} {k2.get_base64()}"
    with pytest.raises(RefusedHostKey, match="HOST KEY CHANGED"):
        accept.missing_host_key(None, "10.0.0.2", k1)                      # a changed key: even with accept_new
    assert user_kh.read_text() == ""


def test_fabric_connections_from_the_inventory(tmp_path):
    from paramiko.client import AutoAddPolicy

    from clusterctl import fabric as cfab

    hosts = (Host(name="n1", address="10.0.0.1", port=2222, user="ops", key_file=str(tmp_path / "k"),
                  known_hosts=str(tmp_path / "kh"), groups=("all",)),
             Host(name="n2", address="10.0.0.2", user="ops", proxy_jump="jump@bastion:2200", groups=("all",)))
    inventory = Inventory("inv.yaml", hosts, {"all": ("n1", "n2")})
    g = cfab.group(inventory, ssh_config=str(tmp_path / "none"))
    c1, c2 = list(g)
    assert (c1.host, c1.port, c1.user, c1.gateway) == ("10.0.0.1", 2222, "ops", False)
    assert c1.connect_kwargs["key_filename"] == [str(tmp_path / "k")]
    assert (c2.gateway.host, c2.gateway.port, c2.gateway.user) == ("bastion", 2200, "jump")
    for c in (c1, c2, c2.gateway):
        assert isinstance(c.client._policy, cfab.HostKeyPolicy) and not isinstance(c.client._policy, AutoAddPolicy)
    assert str(tmp_path / "kh") in c1.client._policy.known_files
    assert c1.client._policy.record_file == str(tmp_path / "kh")
    assert [c.clusterctl_host.name for c in cfab.group(inventory, limit="n2", ssh_config=str(tmp_path / "none"))] \
        == ["n2"]


def test_limit_speaks_the_inventorys_range_syntax_and_refuses_a_shell_class(tmp_path):
    from clusterctl.config import hostpattern, inventory
    from clusterctl.errors import UserError

    p = tmp_path / "i.yaml"
    p.write_text("all:\n  hosts:\n    gpu[01:06]:\n")
    inv = inventory.load(str(p))
    assert [h.name for h in hostpattern.select(inv, "gpu[01:04]")] == ["gpu01", "gpu02", "gpu03", "gpu04"]
    with pytest.raises(UserError, match=r"\[FIRST:LAST\]: 'gpu\[1:4\]'"):
        hostpattern.select(inv, "gpu[1-4]")
