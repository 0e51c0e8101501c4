"""On-call toolkit, items 1, 2, 3, 7 of issue 13, on the session testbed through the real CLI (subprocesses):
`clusterctl exec`, `clusterctl shell`, `clusterctl stacks` + the stacks the supervisor records on a hang, and
`clusterctl.fabric.group`.

The job tests share one job (module fixture ``hung``): 2 nodes x 2 ranks in podman containers running
tests/integration/jobs/hang.py, where rank 3 blocks forever in ``stuck_in_own_code`` while ranks 0-2 wait in
``all_reduce`` (called from ``wait_in_collective``). They run in file order while it hangs; the last one waits
for the supervisor's ``hang`` verdict (``hang_timeout_s``) and checks the recorded failure.
"""
from __future__ import annotations

import json
import os
import pty
import re
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.integration import recovery_harness as rh

REPO = Path(__file__).resolve().parents[2]
HANG = REPO / "tests" / "integration" / "jobs" / "hang.py"
HANG_TIMEOUT_S = 60


def cli(state: Path | None, *args: str, timeout: float = 120, input: str | None = None,
        env: dict | None = None) -> subprocess.CompletedProcess:
    e = {k: v for k, v in os.environ.items() if k not in ("CLUSTERCTL_INVENTORY", "CLUSTERCTL_STATE_DIR")}
    e.update(env or {})
    argv = [sys.executable, "-m", "clusterctl.cli", *(["--state-dir", str(state)] if state else []), *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=e, cwd=str(REPO),
                          input=input, stdin=None if input is not None else subprocess.DEVNULL)


def cpu_inventory(tb, path: Path, runtime: str = "podman", **kw) -> Path:
    """The testbed's inventory with no GPUs (the podman runtime would add CDI flags for GPUs)."""
    p = tb.inventory(path, runtime=runtime, **kw)
    data = yaml.safe_load(p.read_text())
    for hv in data["all"]["hosts"].values():
        hv["clusterctl_gpus"] = 0
    data["all"]["vars"]["clusterctl_gpus"] = 0
    p.write_text(yaml.safe_dump(data, sort_keys=False))
    return p


@pytest.fixture(scope="module")
def inv(testbed, tmp_path_factory) -> Path:
    return cpu_inventory(testbed, tmp_path_factory.mktemp("tka") / "inventory.yaml")


def names(tb) -> list[str]:
    return [h.name for h in tb.hosts]


# ------------------------------------------------------------------------------------------------ 1. exec
def test_exec_groups_identical_results_and_quotes_argv(testbed, inv, tmp_path):
    r = cli(None, "exec", "-i", str(inv), "--", "hostname")
    assert r.returncode == 0, r.stderr
    for n in names(testbed):                       # every host differs: one block each, headed by the host
        assert re.search(rf"^{n} \(1 host\): exit 0$", r.stdout, re.M), r.stdout
        assert re.search(rf"^{n}$", r.stdout, re.M)
    same = cli(None, "exec", "-i", str(inv), "--", "sh", "-c", "echo same; echo warn >&2")
    assert same.returncode == 0
    head = ",".join(names(testbed)) + f" ({len(names(testbed))} hosts): exit 0"
    assert same.stdout.count("exit 0") == 1 and head in same.stdout, same.stdout
    assert "same" in same.stdout and "[stderr] warn" in same.stdout
    # argv is quoted: a shell metacharacter reaches the command as text
    marker = tmp_path / "pwned"
    lit = cli(None, "exec", "-i", str(inv), "--limit", "node1", "-o", "json", "--", "echo", f"$(touch {marker})", ";",
              "id")
    assert lit.returncode == 0
    [res] = json.loads(lit.stdout)
    assert res == {"host": "node1", "exit_code": 0, "stdout": f"$(touch {marker}) ; id\n", "stderr": "",
                   "error": None}
    assert not marker.exists()


def test_exec_limit_json_and_exit_codes(testbed, inv):
    # names, groups, comma lists and globs, as preflight --limit; JSON list in inventory order
    r = cli(None, "exec", "-i", str(inv), "--limit", "node[3:4],node1", "-o", "json", "--", "sh", "-c",
            'test "$(hostname)" != node3')
    assert r.returncode == 1                    # node3 exited 1
    res = json.loads(r.stdout)
    assert [x["host"] for x in res] == ["node1", "node3", "node4"]
    assert [x["exit_code"] for x in res] == [0, 1, 0]
    assert all(set(x) == {"host", "exit_code", "stdout", "stderr", "error"} and x["error"] is None for x in res)
    assert json.loads(cli(None, "exec", "-i", str(inv), "--limit", "all", "-o", "json", "--", "true").stdout)[5][
        "host"] == "node6"
    ok = cli(None, "exec", "-i", str(inv), "--limit", "node*", "--", "true")
    assert ok.returncode == 0 and "6/6 host(s) exited 0" in ok.stdout
    # usage: exit 2
    assert cli(None, "exec", "-i", str(inv)).returncode == 2                      # no command
    bad = cli(None, "exec", "-i", str(inv), "--limit", "gpu9", "--", "true")
    assert bad.returncode == 2 and "gpu9" in bad.stderr and "Traceback" not in bad.stderr
    assert cli(None, "exec", "-i", str(inv), "--node", "node1", "--", "true").returncode == 2  # --node needs --job


def test_exec_unreachable_host_is_an_error_within_connect_timeout(testbed, inv):
    testbed.partition("node3")
    try:
        t0 = time.monotonic()
        r = cli(None, "exec", "-i", str(inv), "--limit", "node2,node3", "-o", "json", "--", "hostname")
        elapsed = time.monotonic() - t0
        table = cli(None, "exec", "-i", str(inv), "--", "sh", "-c", "nproc; uname -r")
        print(f"$ clusterctl exec -i inventory.yaml -- sh -c 'nproc; uname -r'\n{table.stdout}(exit {table.returncode})")
    finally:
        testbed.heal("node3")
    assert r.returncode == 1
    res = {x["host"]: x for x in json.loads(r.stdout)}
    assert res["node2"]["exit_code"] == 0 and res["node2"]["stdout"] == "node2\n"
    assert res["node3"]["exit_code"] is None and "timed out" in res["node3"]["error"], res["node3"]
    assert elapsed < 5 + 2 + 1.5, f"{elapsed:.1f}s (connect timeout 5 s + 2 s, + CLI start-up)"


def test_exec_refuses_unknown_host_key(testbed, inv, tmp_path):
    data = yaml.safe_load(inv.read_text())
    empty = tmp_path / "empty_known_hosts"
    empty.write_text("")
    data["all"]["vars"]["clusterctl_known_hosts"] = str(empty)
    other = tmp_path / "inventory.yaml"
    other.write_text(yaml.safe_dump(data))
    r = cli(None, "exec", "-i", str(other), "--limit", "node1", "-o", "json", "--", "true",
            env={"HOME": str(tmp_path)})
    assert r.returncode == 1
    [res] = json.loads(r.stdout)
    assert res["exit_code"] is None and "unknown host key" in res["error"]
    assert empty.read_text() == ""


# ------------------------------------------------------------------------------------------------ the hung job
@pytest.fixture(scope="module")
def hung(testbed, inv, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("tka-job")
    state = tmp / "state"
    spec = {"name": "tkahang", "nodes": 2, "nproc_per_node": 2, "hosts": ["node1", "node2"], "script": str(HANG),
            "rendezvous": {"port": 29400, "join_timeout": 60, "last_call_timeout": 2},
            "restarts": {"max_restarts": 0, "max_node_failures": 0, "max_failures": 0},
            # the on-call commands need the job hung for a while: not ended by the stuck rank after 20 s (issue 37)
            "supervisor": {"probe_interval_s": 1, "hang_timeout_s": HANG_TIMEOUT_S, "stuck_timeout_s": 0},
            "container": {"ulimits": {}}}
    job = tmp / "job.yaml"
    job.write_text(yaml.safe_dump(spec, sort_keys=False))
    r = cli(state, "launch", str(job), "-i", str(inv), "--detach", "--skip-preflight", timeout=90)
    assert r.returncode == 0, r.stdout + r.stderr
    log = state / "jobs"
    try:
        end = time.monotonic() + 150
        while time.monotonic() < end:
            text = "".join(p.read_text(errors="replace") for p in log.rglob("output.log"))
            if text.count("entering the hang") >= 4:
                break
            row = rh.job_row(state, "tkahang")          # the state DB: a CLI process per look costs ~1 s of CPU
            assert row is None or not row.terminal, (row, text[-3000:])
            time.sleep(1)
        else:
            raise AssertionError("the job never reached its hang:\n" + cli(state, "events", "tkahang").stdout)
        yield state
    finally:
        st = cli(state, "status", "tkahang", "-o", "json")
        if st.returncode == 0 and json.loads(st.stdout).get("supervisor_pid"):
            cli(state, "stop", "tkahang", "--grace", "0", timeout=120)


def controller_rank_views(state: Path, name: str, tmp: Path, timeout: float = 90) -> tuple[dict, dict, Path]:
    """What a controller hears of every rank of the job's current attempt (issue 37's rank view), through the real
    ``ClusterOps`` (its own, beside the supervisor's: the nodes' watches over SSH), once every rank is heard in the
    hang hang.py makes: rank 3 ``still`` in its own code, ranks 0-2 ``waiting`` in all_reduce; then every rank's
    flight-recorder dump and stack fetched with ``dump_ranks``. Returns (node -> rank -> view, dump errors, dump dir)."""
    from clusterctl.store.ledger import Ledger
    from clusterctl.store.logcopy import LogSink
    from clusterctl.supervise.cluster_ops import ClusterOps
    from clusterctl.transport import ConnectOptions

    store = rh.open_store(state)
    job = store.find_job(name)
    rec = Ledger(store).record(job)
    att = store.attempts(job.job_id)[-1]
    ops = ClusterOps(spec=rec.spec, hosts=rec.hosts_by_name, job_id=job.job_id, store=store,
                     sink=LogSink(tmp / "controller-output.log"), options=ConnectOptions(accept_new_host_keys=False),
                     interfaces=dict(rec.interfaces))
    views: dict = {}
    try:
        ops.adopt(att.attempt, list(att.nodes), att.rdzv_host)
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            ops.observe(att.attempt, list(att.nodes))          # starts the watches
            views = ops.rank_views(att.attempt)
            hints = {r: v.hint for rs in views.values() for r, v in rs.items()}
            if hints == {0: "waiting", 1: "waiting", 2: "waiting", 3: "still"}:
                break
            time.sleep(1)
        else:
            raise AssertionError(f"the controller heard: {views}")
        dest = tmp / f"hang-{att.attempt}"
        return views, ops.dump_ranks(att.attempt, list(att.nodes), str(dest)), dest
    finally:
        ops.close()
        store.close()


def check_rank_views(views: dict, errors: dict, dest: Path) -> None:
    """hang.py's hang as the rank view tells it: every rank heard from its own node, rank 3 still in
    stuck_in_own_code, the others waiting in all_reduce #4 (3 completed); the dump holds every rank's flight
    record and stack, and torch's analyzer reads it and names rank 3 as missing."""
    assert {n: sorted(rs) for n, rs in views.items()} == {"node1": [0, 1], "node2": [2, 3]} or \
        {n: sorted(rs) for n, rs in views.items()} == {"node3": [0, 1], "node4": [2, 3]}, views
    flat = {r: v for rs in views.values() for r, v in rs.items()}
    assert flat[3].where.endswith("stuck_in_own_code") and flat[3].in_coll is None and flat[3].colls == 3
    for r in (0, 1, 2):
        assert flat[r].in_coll is not None and flat[r].in_coll.op == "all_reduce" and flat[r].in_coll.seq == 4
        assert flat[r].in_coll.for_s >= 1 and flat[r].colls == 3 and flat[r].step is None      # no optimizer
    assert all(v.answered_age_s < 3 for v in flat.values())
    assert errors == {}, errors
    assert sorted(p.name for p in dest.iterdir()) == ["fr-0", "fr-1", "fr-2", "fr-3", "stack-0.txt", "stack-1.txt",
                                                      "stack-2.txt", "stack-3.txt"]
    assert "stuck_in_own_code" in (dest / "stack-3.txt").read_text()
    r = subprocess.run([sys.executable, "-m", "torch.distributed.flight_recorder.fr_trace", str(dest), "-p", "fr-"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "missing ranks: {3}" in r.stdout + r.stderr, r.stdout + r.stderr


def test_the_controller_hears_every_rank_and_names_the_blocked_one(hung, tmp_path):
    """Issue 37's rank view, podman: first in the file, while the hang is fresh."""
    check_rank_views(*controller_rank_views(hung, "tkahang", tmp_path))


def test_exec_on_job_nodes_in_container(hung):
    r = cli(hung, "exec", "--job", "tkahang", "--in-container", "-o", "json", "--", "sh", "-c",
            'test -e /run/.containerenv && echo in-container; pwd')
    assert r.returncode == 0, r.stdout + r.stderr
    res = json.loads(r.stdout)
    assert [x["host"] for x in res] == ["node1", "node2"]
    assert all(x["stdout"].startswith("in-container\n") for x in res), res
    host = cli(hung, "exec", "--job", "tkahang", "--node", "node2", "-o", "json", "--", "sh", "-c",
               "hostname; test -e /run/.containerenv || echo on-host")
    assert json.loads(host.stdout) == [{"host": "node2", "exit_code": 0, "stdout": "node2\non-host\n",
                                        "stderr": "", "error": None}]
    assert cli(hung, "exec", "--job", "tkahang", "--node", "node5", "--", "true").returncode == 2


def test_shell_with_piped_stdin(hung):
    r = cli(hung, "shell", "tkahang", input='echo "$((6*7))"; test -e /run/.containerenv && echo CONTAINER; '
                                           'test -t 0 || echo no-tty; exit 7\n')
    assert r.returncode == 7, r.stdout + r.stderr
    assert r.stdout.split() == ["42", "CONTAINER", "no-tty"]
    r2 = cli(hung, "shell", "tkahang", "--node", "node2", input="ps -eo args | grep -c '[h]ang.py'\n")
    assert r2.returncode == 0 and int(r2.stdout.strip()) >= 3, r2.stdout + r2.stderr   # torchrun + 2 ranks


def test_shell_interactive_pty(hung):
    """Under a terminal: a remote pty (the shell sees a tty), what we type runs, the exit code comes back."""
    env = {k: v for k, v in os.environ.items() if k != "CLUSTERCTL_STATE_DIR"}
    pid, fd = pty.fork()
    if pid == 0:
        os.chdir(REPO)
        os.execve(sys.executable, [sys.executable, "-m", "clusterctl.cli", "--state-dir", str(hung), "shell",
                                   "tkahang"], env)
    out = b""

    def read_until(pattern: bytes, timeout: float = 60) -> None:
        nonlocal out
        end = time.monotonic() + timeout
        while pattern not in out and time.monotonic() < end:
            r, _, _ = select.select([fd], [], [], 0.5)
            if r:
                try:
                    out += os.read(fd, 65536)
                except OSError:
                    break
        assert pattern in out, out[-2000:]

    # the local terminal echoes what we type before the shell starts: wait for what only the remote side prints
    os.write(fd, b"tty; echo TTY-$((40+2)); test -e /run/.containerenv && echo IN-CONTAINER-$((2*3))\n")
    read_until(b"IN-CONTAINER-6")
    assert b"TTY-42" in out and b"/dev/pts/" in out, out[-2000:]
    os.write(fd, b"exit 5\n")
    end = time.monotonic() + 30
    while time.monotonic() < end:
        wpid, status = os.waitpid(pid, os.WNOHANG)
        if wpid:
            break
        try:
            if select.select([fd], [], [], 0.2)[0]:
                out += os.read(fd, 65536)
        except OSError:
            pass
    else:
        os.kill(pid, 9)
        raise AssertionError(f"shell did not end: {out[-2000:]!r}")
    os.close(fd)
    assert os.waitstatus_to_exitcode(status) == 5, out[-2000:]


def _spy_dirs() -> set[str]:
    return {str(p.parent) for p in Path("/tmp").glob("tmp.*/py-spy")}


def test_stacks_groups_the_blocked_rank_apart(hung, testbed):
    before = _spy_dirs()
    r = cli(hung, "stacks", "tkahang", "-o", "json", timeout=240)
    assert r.returncode == 0, r.stdout + r.stderr
    res = json.loads(r.stdout)
    assert [x["rank"] for x in res] == [0, 1, 2, 3]
    assert [x["node"] for x in res] == ["node1", "node1", "node2", "node2"]
    for x in res:
        assert set(x) == {"node", "rank", "pid", "frames"} and x["pid"] > 1
        assert all(set(f) == {"function", "file", "line"} for f in x["frames"])
        assert x["frames"][-1]["function"] == "<module>"            # innermost first, outermost last
    funcs = {x["rank"]: [f["function"] for f in x["frames"]] for x in res}
    assert funcs[3][0] == "stuck_in_own_code", funcs[3]
    for rank in (0, 1, 2):
        assert "wait_in_collective" in funcs[rank] and "all_reduce" in funcs[rank][0], funcs[rank]
    # the pids are the ranks' host pids: they run hang.py
    for x in res:
        cmd = Path(f"/proc/{x['pid']}/cmdline").read_bytes()
        assert str(HANG).encode() in cmd
    table = cli(hung, "stacks", "tkahang", timeout=240)
    assert table.returncode == 0
    print(table.stdout)
    lines = table.stdout.splitlines()
    assert re.match(r"ranks 0-2: \S*all_reduce \u2190 wait_in_collective hang\.py:\d+$", lines[0]), table.stdout
    assert re.match(r"rank 3: stuck_in_own_code hang\.py:\d+$", lines[1]), table.stdout
    one = json.loads(cli(hung, "stacks", "tkahang", "--node", "node2", "-o", "json", timeout=240).stdout)
    assert [x["rank"] for x in one] == [2, 3]
    # the testbed hosts have no py-spy: it was shipped, to a private temp dir that is gone now
    assert testbed.exec("node1", ["sh", "-c", "command -v py-spy || echo none"]).stdout.strip() == "none"
    assert _spy_dirs() <= before


def test_fabric_group_of_the_job(hung, testbed):
    from clusterctl.fabric import group

    g = group(job="tkahang", state_dir=str(hung))
    res = g.run("hostname", hide=True, in_stream=False)
    assert sorted(r.stdout.strip() for r in res.values()) == ["node1", "node2"]


def test_hang_records_where_each_group_of_ranks_waited(hung):
    end = time.monotonic() + HANG_TIMEOUT_S + 150
    while time.monotonic() < end:
        st = json.loads(cli(hung, "status", "tkahang", "-o", "json").stdout)
        # the failure (with its stacks) is recorded before the job's end: on a loaded box a look can fall between
        if st["failures"] and st["failures"][0].get("stacks") is not None and \
                st["state"].lower() in ("failed", "stopped", "succeeded"):
            break
        time.sleep(2)
    else:
        raise AssertionError(cli(hung, "events", "tkahang").stdout)
    f = st["failures"][0]
    assert f["class"] == "hang", f
    assert st["state"].lower() == "failed"          # restarts.max_node_failures: 0
    assert len(f["stacks"]) == 2, f["stacks"]
    assert re.match(r"ranks 0-2: \S*all_reduce \u2190 wait_in_collective hang\.py:\d+$", f["stacks"][0]), f
    assert re.match(r"rank 3: stuck_in_own_code hang\.py:\d+$", f["stacks"][1]), f
    kinds = [e["kind"] for e in json.loads(cli(hung, "events", "tkahang", "-o", "json").stdout)]
    assert kinds.index("stacks") < kinds.index("gang_stop"), kinds          # taken before anything was stopped
    text = cli(hung, "status", "tkahang").stdout
    assert "waiting: rank 3: stuck_in_own_code" in text, text


# ------------------------------------------------------------------------------------------------ 7. fabric
def test_fabric_group_checks_host_keys(testbed, inv, tmp_path):
    import fabric
    from paramiko.client import AutoAddPolicy

    from clusterctl.fabric import RefusedHostKey, group

    kh = tmp_path / "user_known_hosts"     # the user's known_hosts: empty; the inventory's file has the keys
    kh.write_text("")
    g = group(str(inv), limit="node[1:2],node6", known_hosts=str(kh))
    assert isinstance(g, fabric.ThreadingGroup)
    assert all(not isinstance(c.client._policy, AutoAddPolicy) for c in g)
    res = g.run("hostname", hide=True, in_stream=False)
    assert sorted(r.stdout.strip() for r in res.values()) == ["node1", "node2", "node6"]
    assert kh.read_text() == ""

    # unknown host key: refused, nothing recorded
    data = yaml.safe_load(inv.read_text())
    empty = tmp_path / "empty"
    empty.write_text("")
    data["all"]["vars"]["clusterctl_known_hosts"] = str(empty)
    unknown_inv = tmp_path / "unknown.yaml"
    unknown_inv.write_text(yaml.safe_dump(data))
    with pytest.raises(fabric.exceptions.GroupException) as ei:
        group(str(unknown_inv), limit="node1", known_hosts=str(kh)).run("true", hide=True, in_stream=False)
    [err] = ei.value.result.failed.values()
    print(repr(ei.value))
    assert isinstance(err, RefusedHostKey) and "unknown host key" in str(err)
    assert empty.read_text() == "" and kh.read_text() == ""

    # changed host key: node2's key recorded for node1's address
    lines = testbed.known_hosts.read_text().splitlines()
    n1, n2 = testbed.host("node1").address, testbed.host("node2").address
    key2 = next(ln for ln in lines if ln.startswith(n2 + " ")).split(" ", 1)[1]
    changed = tmp_path / "changed"
    changed.write_text(f"{n1} {key2}\n")
    data["all"]["vars"]["clusterctl_known_hosts"] = str(changed)
    changed_inv = tmp_path / "changed.yaml"
    changed_inv.write_text(yaml.safe_dump(data))
    with pytest.raises(RefusedHostKey, match="HOST KEY CHANGED"):
        group(str(changed_inv), limit="node1", known_hosts=str(kh), accept_new_host_keys=True)[0].run("true", in_stream=False)

    # accept_new records an unknown key (like OpenSSH accept-new), then it is known
    res = group(str(unknown_inv), limit="node1", known_hosts=str(kh), accept_new_host_keys=True).run(
        "true", hide=True, in_stream=False)
    assert all(r.ok for r in res.values()) and n1 in empty.read_text()


def test_fabric_proxy_jump_is_a_gateway(testbed, inv, tmp_path):
    from clusterctl.fabric import group

    n1 = testbed.host("node1").address
    data = yaml.safe_load(inv.read_text())
    data["all"]["hosts"]["node3"]["clusterctl_proxy_jump"] = f"{testbed.user}@{n1}"
    jinv = tmp_path / "jump.yaml"
    jinv.write_text(yaml.safe_dump(data))
    cfg = tmp_path / "ssh_config"                 # the bastion's key, as ~/.ssh/config would give it
    cfg.write_text(f"Host {n1}\n    IdentityFile {testbed.key}\n")
    kh = tmp_path / "kh"
    kh.write_text("")
    g = group(str(jinv), limit="node3", known_hosts=str(kh), ssh_config=str(cfg))
    [conn] = list(g)
    assert conn.gateway and conn.gateway.host == n1
    r = conn.run('echo "$SSH_CONNECTION"', hide=True, in_stream=False)
    assert r.stdout.split()[0] == n1          # node3 saw the connection come from the bastion (node1)


# ------------------------------------------------------------------------------------------------ bare runtime
def test_bare_job_exec_shell_stacks_run_in_the_job_directory(testbed, tmp_path):
    """Bare: `exec --in-container` and `shell` run on the host in the job's directory; `stacks` finds the ranks."""
    inv = cpu_inventory(testbed, tmp_path / "inventory.yaml", runtime="bare")
    state, wd = tmp_path / "state", tmp_path / "work dir"          # a space: the directory is quoted
    wd.mkdir()
    spec = {"name": "tkabare", "nodes": 2, "nproc_per_node": 2, "hosts": ["node3", "node4"], "script": str(HANG),
            "workdir": str(wd), "torchrun": [str(Path(sys.prefix) / "bin" / "torchrun")],   # no venv on the hosts' PATH
            "rendezvous": {"port": 29400, "join_timeout": 60, "last_call_timeout": 2},
            "restarts": {"max_restarts": 0},     # hung for the on-call commands: no stuck verdict after 20 s
            "supervisor": {"probe_interval_s": 1, "hang_timeout_s": 900, "stuck_timeout_s": 0}}
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump(spec, sort_keys=False))
    r = cli(state, "launch", str(job), "-i", str(inv), "--detach", "--skip-preflight", timeout=90)
    assert r.returncode == 0, r.stdout + r.stderr
    try:
        end = time.monotonic() + 150
        while time.monotonic() < end:
            text = "".join(p.read_text(errors="replace") for p in (state / "jobs").rglob("output.log"))
            if text.count("entering the hang") >= 4:
                break
            time.sleep(1)
        else:
            raise AssertionError(cli(state, "events", "tkabare").stdout + text[-3000:])
        check_rank_views(*controller_rank_views(state, "tkabare", tmp_path))    # issue 37's rank view, bare
        ex = cli(state, "exec", "--job", "tkabare", "--in-container", "-o", "json", "--", "pwd")
        assert [(x["host"], x["stdout"]) for x in json.loads(ex.stdout)] == [("node3", f"{wd}\n"), ("node4", f"{wd}\n")]
        sh = cli(state, "shell", "tkabare", input="pwd; hostname; exit 9\n")
        assert sh.returncode == 9 and sh.stdout.split("\n")[:2] == [str(wd), "node3"], sh.stdout + sh.stderr
        st = cli(state, "stacks", "tkabare", timeout=240)
        assert st.returncode == 0, st.stdout + st.stderr
        assert re.match(r"ranks 0-2: \S*all_reduce \u2190 wait_in_collective hang\.py:\d+\nrank 3: stuck_in_own_code "
                        r"hang\.py:\d+\n", st.stdout), st.stdout
    finally:
        cli(state, "stop", "tkabare", "--grace", "0", timeout=120)
