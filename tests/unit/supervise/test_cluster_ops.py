"""``ClusterOps.start``/``stop`` over fake transports: a node's failure is a typed ``NodeError`` (its kind from what
failed, its text as before), and a start that fails anywhere is rolled back everywhere."""
from __future__ import annotations

import contextlib

from clusterctl.config.inventory import Host
from clusterctl.config.spec import loads_job
from clusterctl.errors import CommandTimeout, ConnectError, DeadlineExceeded
from clusterctl.launch import runtimes
from clusterctl.model.verdicts import ErrorKind, NodeError, Started
from clusterctl.store.logcopy import LogSink
from clusterctl.supervise.cluster_ops import ClusterOps
from clusterctl.supervise.recovery import CommandFailed, node_error
from clusterctl.transport.base import CommandResult

JOB = """
name: j
nodes: 3
nproc_per_node: 1
script: train.py
container: {ulimits: {}}
"""
HOSTS = {f"n{i}": Host(name=f"n{i}", address=f"10.0.0.{i}", runtime="podman", gpus=0) for i in (1, 2, 3)}


class Node:
    """``fail``: None, "start" (the start command exits 125), "timeout" (every command times out)."""

    def __init__(self, host, fail=None):
        self.host, self.fail, self.runs, self.timeouts = host, fail, [], []

    def run(self, argv, *, timeout, stdin=None) -> CommandResult:
        self.runs.append(list(argv))
        self.timeouts.append(timeout)
        if self.fail == "timeout":
            raise CommandTimeout(self.host.name, f"command timed out after {timeout:g}s: {argv[0]}")
        if self.fail == "start" and stdin is not None:
            return CommandResult(tuple(argv), 125, "", "Error: short-name resolution enforced\n", 0.01)
        if self.fail == "remove" and "rm" in " ".join(argv):
            return CommandResult(tuple(argv), 1, "", "", 0.01)
        return CommandResult(tuple(argv), 0, "[]", "", 0.01)

    def close(self):
        pass


class Store:
    def __init__(self):
        self.nodes = []

    def set_node(self, job_id, attempt, node, **kw):
        self.nodes.append((attempt, node, kw["state"]))

    def transaction(self):      # the ledger writes a node's row in one
        return contextlib.nullcontext()


class Mux:
    def add(self, name, opener, on_data, **kw):
        return self

    def flush(self, streams, timeout=2.0):
        return True

    def stop(self):
        pass

    def close(self):
        pass


def _ops(tmp_path, nodes: dict[str, Node], job: str = JOB) -> ClusterOps:
    def connect(host, options):
        n = nodes[host.name]
        if n.fail == "connect":
            raise ConnectError(host.name, "cannot connect to 10.0.0.2:22: Connection refused")
        return n

    return ClusterOps(spec=loads_job(job, "job.yaml"), hosts=HOSTS, job_id="j-1", store=Store(),
                      sink=LogSink(tmp_path / "o.log"), connect=connect, mux=Mux)


def test_start_failures_are_typed_and_what_started_is_removed(tmp_path):
    nodes = {"n1": Node(HOSTS["n1"]), "n2": Node(HOSTS["n2"], "connect"), "n3": Node(HOSTS["n3"], "start")}
    ops = _ops(tmp_path, nodes)
    try:
        errors = ops.start(1, list(HOSTS), "n1", ("", 0)).errors
    finally:
        ops.close()
    assert errors == {
        "n2": NodeError("n2", ErrorKind.UNREACHABLE, "n2: cannot connect to 10.0.0.2:22: Connection refused"),
        "n3": NodeError("n3", ErrorKind.COMMAND_FAILED, "Error: short-name resolution enforced"),
    }
    assert str(errors["n3"]) == "Error: short-name resolution enforced"      # the text events show, as before
    assert ops.store.nodes == []        # ClusterOps writes nothing (issue 36): the ledger writes what start returns
    assert "rm" in " ".join(nodes["n1"].runs[-1])                            # rolled back on n1


def _modes(started: Started) -> dict[str, tuple[str, str]]:
    """node -> (warm | cold, why) of a start that started every node."""
    assert started.errors == {}
    return {n: (s.mode, s.why) for n, s in started.nodes.items()}


def test_start_everywhere_is_no_error_attaches_and_returns_the_rows(tmp_path):
    """The start writes nothing (issue 36: its rows came from the fan-out's threads): each node's row comes back
    as a value, for the supervisor's ``attempt_running`` transaction."""
    nodes = {n: Node(h) for n, h in HOSTS.items()}
    ops = _ops(tmp_path, nodes)
    try:
        started = ops.start(1, list(HOSTS), "n1", ("", 0))
        assert started.errors == {} and sorted(ops.watches.snapshot()) == sorted(HOSTS)
        assert {n: s.row() for n, s in started.nodes.items()} == {
            n: {"address": h.address, "container": ops.plan.node(n).container_name, "state": "running"}
            for n, h in HOSTS.items()}
        assert ops.store.nodes == []
    finally:
        ops.close()


def test_stop_failures_are_typed(tmp_path):
    nodes = {"n1": Node(HOSTS["n1"]), "n2": Node(HOSTS["n2"], "timeout"), "n3": Node(HOSTS["n3"], "remove")}
    ops = _ops(tmp_path, nodes)
    try:
        errors = ops.stop(None, list(HOSTS))
    finally:
        ops.close()
    assert errors == {"n2": NodeError("n2", ErrorKind.TIMEOUT, "n2: command timed out after 60s: sh"),
                      "n3": NodeError("n3", ErrorKind.COMMAND_FAILED, "exit code 1")}


def test_node_error_kinds():
    assert node_error("a", DeadlineExceeded("a", "no answer within 90s")) == NodeError(
        "a", ErrorKind.TIMEOUT, "a: no answer within 90s")
    assert node_error("a", CommandFailed("boom")).kind == ErrorKind.COMMAND_FAILED
    assert node_error("a", KeyError("x")) == NodeError("a", ErrorKind.ERROR, "'x'")


def test_a_first_attempt_starts_with_one_command_per_node_a_relaunch_removes_leftovers_first(tmp_path):
    """A new job id has nothing on any node to remove; a relaunch first removes what the last attempt left."""
    nodes = {n: Node(h) for n, h in HOSTS.items()}
    ops = _ops(tmp_path, nodes, JOB + "recovery: cold\n")
    try:
        remove = runtimes.get("podman").remove_job_argv("j-1")
        recovery = _modes(ops.start(1, list(HOSTS), "n1", ("", 0)))
        assert [len(n.runs) for n in nodes.values()] == [1, 1, 1] and all(n.runs[0] != remove for n in nodes.values())
        recovery = _modes(ops.start(2, list(HOSTS), "n1", ("", 0)))
        assert all(n.runs[1] == remove and len(n.runs) == 3 for n in nodes.values())   # no ping, no zygote
        assert recovery == {n: ("cold", "recovery: cold in the job") for n in HOSTS}    # the cold strategy's why
        assert ops.stop(None, list(HOSTS)) == {}
        assert all(n.runs[-1] == remove for n in nodes.values())       # it keeps nothing on a node to remove
    finally:
        ops.close()


def test_a_relaunch_skips_the_leftovers_removal_on_nodes_its_stop_just_cleaned(tmp_path):
    """The gang stop removed the attempt's containers on the survivors: removing again costs a runtime command per
    node on the way back. A node the stop did not reach (or that started since) is still cleaned first."""
    nodes = {n: Node(h) for n, h in HOSTS.items()}
    ops = _ops(tmp_path, nodes, JOB + "recovery: cold\n")
    try:
        remove = runtimes.get("podman").remove_job_argv("j-1")
        recovery = _modes(ops.start(1, list(HOSTS), "n1", ("", 0)))
        assert ops.stop(1, ["n1", "n2"]) == {}
        for n in nodes.values():
            n.runs.clear()
        recovery = _modes(ops.start(2, list(HOSTS), "n1", ("", 0)))
        assert [remove in n.runs for n in nodes.values()] == [False, False, True]
        recovery = _modes(ops.start(3, list(HOSTS), "n1", ("", 0)))      # started since: cleaned again
        assert [n.runs.count(remove) for n in nodes.values()] == [1, 1, 2]
    finally:
        ops.close()


def test_the_start_commands_are_bounded_by_the_jobs_start_timeout(tmp_path):
    """A saturated host (64 testbed nodes on 2 cores) or a slow real node needs more than a fixed 30 s for the
    leftovers' removal of a relaunch: every start command gets the job's ``supervisor.start_timeout_s``."""
    nodes = {n: Node(h) for n, h in HOSTS.items()}
    ops = _ops(tmp_path, nodes, JOB + "supervisor: {start_timeout_s: 240}\nrecovery: cold\n")
    try:
        recovery = _modes(ops.start(1, list(HOSTS), "n1", ("", 0)))
        recovery = _modes(ops.start(2, list(HOSTS), "n1", ("", 0)))
    finally:
        ops.close()
    assert all(n.timeouts == [240, 240, 240] for n in nodes.values())
    assert loads_job(JOB, "job.yaml").supervisor.start_timeout_s == 60


def test_stacks_report_is_private_and_never_written_through_a_symlink(tmp_path, monkeypatch):
    """Issue 24 item 14: ``stacks-<N>.json`` is 0600 whatever the umask, and a symlink planted at its name is
    replaced, not followed."""
    import os
    import stat

    nodes = {n: Node(h) for n, h in HOSTS.items()}
    ops = _ops(tmp_path, nodes)
    victim = tmp_path / "victim"
    victim.write_text("keep me")
    (tmp_path / "stacks-2.json").symlink_to(victim)
    old = os.umask(0o022)
    try:
        ops.stacks(1, ["n1"])
        ops.stacks(2, ["n1"])
    finally:
        os.umask(old)
        ops.close()
    for n in (1, 2):
        st = os.lstat(tmp_path / f"stacks-{n}.json")
        assert stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o600
    assert victim.read_text() == "keep me"


class Zygotes(Node):
    """A node whose zygote answers the ping (``up``) or not."""

    def __init__(self, host, up):
        super().__init__(host)
        self.up = up

    def run(self, argv, *, timeout, stdin=None) -> CommandResult:
        if argv[3:4] == ["clusterctl-warm-ping"]:
            self.runs.append(list(argv))
            err = "" if self.up else "clusterctl: no zygote in /tmp/clusterctl-warm-0/x\n"
            return CommandResult(tuple(argv), 0 if self.up else 4, "", err, 0.01)
        return super().run(argv, timeout=timeout, stdin=stdin)


def test_warm_recovery_forks_survivors_from_their_zygote_and_a_node_without_one_runs_cold(tmp_path):
    """First attempt: cold, then each node's zygote is (re)started. A relaunch pings each node's zygote: one that
    answers gets the warm start (torchrun through the zygote's client, the warm dir mounted); one that does not
    gets the cold start and a fresh zygote. ``recovery`` says which and why."""
    nodes = {"n1": Zygotes(HOSTS["n1"], True), "n2": Zygotes(HOSTS["n2"], True), "n3": Zygotes(HOSTS["n3"], False)}
    ops = _ops(tmp_path, nodes)
    rt = runtimes.get("podman")
    try:
        recovery = _modes(ops.start(1, list(HOSTS), "n1", ("", 0)))
        p1 = ops.plan
        for name, n in nodes.items():
            node = p1.node(name)
            assert n.runs == [list(node.runtime_argv),
                              rt.zygote_remove_argv("j-1", name, runtimes.warm_key("j-1", name)),
                              list(node.zygote_argv)]
            assert recovery[name] == ("cold", "the job's first attempt")
            n.runs.clear()
        recovery = _modes(ops.start(2, list(HOSTS), "n2", ("", 0)))
        p2 = ops.plan
        for name in ("n1", "n2"):
            node = p2.node(name)
            assert nodes[name].runs == [rt.remove_job_argv("j-1"), rt.zygote_ping_argv(node.warm_dir),
                                        list(node.warm_argv)]
            assert recovery[name][0] == "warm"
            argv = list(node.warm_argv)
            inside = runtimes.warm_path(node.warm_dir, True)
            client = runtimes.zygote_client(inside, "torchrun")
            start = argv.index(client[0], argv.index("clusterctl-env"))
            assert argv[start:start + len(client)] == client      # the agent is forked by the zygote,
            assert argv[argv.index("--no-python") + 1:][:7] == runtimes.zygote_client(inside, "rank")  # ranks too
            assert f"--volume={runtimes.WARM_PLACEHOLDER}/s:{inside}/s" in argv       # the node's warm dir,
            assert argv[:5] == runtimes.warm_exec(node.warm_dir, [])                   # put in on the node
        node = p2.node("n3")
        assert nodes["n3"].runs == [rt.remove_job_argv("j-1"), rt.zygote_ping_argv(node.warm_dir),
                                    list(node.runtime_argv),
                                    rt.zygote_remove_argv("j-1", "n3", node.warm_dir), list(node.zygote_argv)]
        assert recovery["n3"] == ("cold", "no zygote on the node (a new node, or its zygote had not started yet)")
    finally:
        ops.close()


class WarmRootNotOurs(Node):
    """A node whose warm root another user made first: the ping says so (exit 3, runtimes.WARM_ROOT_SH)."""

    WHY = ("warm disabled: /tmp/clusterctl-warm-0 is not a private directory of uid 0 (owner uid 65534, "
           "mode drwxrwxrwt)")

    def run(self, argv, *, timeout, stdin=None) -> CommandResult:
        if argv[3:4] == ["clusterctl-warm-ping"]:
            self.runs.append(list(argv))
            return CommandResult(tuple(argv), 3, "", f"clusterctl: {self.WHY}\n", 0.01)
        return super().run(argv, timeout=timeout, stdin=stdin)


def test_a_node_whose_warm_root_is_not_ours_starts_cold_with_the_reason_and_no_zygote(tmp_path):
    nodes = {"n1": WarmRootNotOurs(HOSTS["n1"]), "n2": Zygotes(HOSTS["n2"], True), "n3": Zygotes(HOSTS["n3"], True)}
    ops = _ops(tmp_path, nodes)
    rt = runtimes.get("podman")
    try:
        recovery = _modes(ops.start(1, list(HOSTS), "n2", ("", 0)))
        for n in nodes.values():
            n.runs.clear()
        recovery = _modes(ops.start(2, list(HOSTS), "n2", ("", 0)))
        node = ops.plan.node("n1")
        assert recovery["n1"] == ("cold", WarmRootNotOurs.WHY)
        assert nodes["n1"].runs == [rt.remove_job_argv("j-1"), rt.zygote_ping_argv(node.warm_dir),
                                    list(node.runtime_argv)]            # no zygote start: it would fail the same
    finally:
        ops.close()


class WarmStartFails(Zygotes):
    """The zygote answers its ping, then the warm start (the attempt container with the zygote's client) fails."""

    def run(self, argv, *, timeout, stdin=None) -> CommandResult:
        if stdin is not None and "--no-python" in argv:        # only the warm start runs ranks through a client
            self.runs.append(list(argv))
            return CommandResult(tuple(argv), 125, "", "Error: statfs /tmp/clusterctl-warm/x: no such file\n", 0.01)
        return super().run(argv, timeout=timeout, stdin=stdin)


def test_a_warm_start_that_fails_after_the_ping_is_retried_cold_once(tmp_path):
    """A zygote that answers but whose warm start fails: what the failed start left is removed, the node starts
    cold (and gets a fresh zygote), and ``recovery`` says why; the node is not left out of the attempt."""
    nodes = {"n1": Zygotes(HOSTS["n1"], True), "n2": WarmStartFails(HOSTS["n2"], True),
             "n3": Zygotes(HOSTS["n3"], True)}
    ops = _ops(tmp_path, nodes)
    rt = runtimes.get("podman")
    try:
        recovery = _modes(ops.start(1, list(HOSTS), "n1", ("", 0)))
        for n in nodes.values():
            n.runs.clear()
        recovery = _modes(ops.start(2, list(HOSTS), "n1", ("", 0)))
        node = ops.plan.node("n2")
        assert nodes["n2"].runs == [rt.remove_job_argv("j-1"), rt.zygote_ping_argv(node.warm_dir),
                                    list(node.warm_argv), rt.remove_job_argv("j-1"), list(node.runtime_argv),
                                    rt.zygote_remove_argv("j-1", "n2", node.warm_dir), list(node.zygote_argv)]
        assert recovery["n2"] == ("cold", "its warm start failed (Error: statfs /tmp/clusterctl-warm/x: no such "
                                              "file): started cold")
        assert recovery["n1"][0] == recovery["n3"][0] == "warm"
    finally:
        ops.close()


def test_stopping_the_job_removes_its_zygotes_a_relaunch_keeps_them(tmp_path):
    nodes = {n: Node(h) for n, h in HOSTS.items()}
    ops = _ops(tmp_path, nodes)
    rt = runtimes.get("podman")
    try:
        assert ops.stop(3, list(HOSTS)) == {}
        assert all(n.runs == [rt.remove_job_argv("j-1")] for n in nodes.values())
        assert ops.stop(None, list(HOSTS)) == {}
        assert all(n.runs[-1] == rt.zygote_remove_argv("j-1", name, runtimes.warm_key("j-1", name))
                   for name, n in nodes.items())
    finally:
        ops.close()
