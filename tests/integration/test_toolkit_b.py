"""Issue 13 items 4-6 on the testbed, through the real `clusterctl` CLI: notifications to a real HTTP server living
on a testbed host (and a command), the job history (`status` list, `--watch`, `events -f`, `forget`), and cordons
(the supervisor's own after a lost node, `nodes`, launch and resume skipping cordoned hosts, MIN unmet -> exit 2).
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import yaml

from tests.integration import recovery_harness as rh

HOSTS = ["node1", "node2", "node3"]
HOOK_PORT = 18080
RECEIVER = r'''
import http.server, json, sys
port, out = int(sys.argv[1]), sys.argv[2]
class H(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        with open(out, "a") as f:
            f.write(json.dumps({"path": self.path, "type": self.headers.get("Content-Type"),
                                "body": json.loads(body)}) + "\n")
        self.send_response(500 if self.path.startswith("/fail") else 200)
        self.end_headers()
    def log_message(self, *a):
        pass
http.server.ThreadingHTTPServer(("0.0.0.0", port), H).serve_forever()
'''
RECORD_ENV = ("import json, os, sys; open(sys.argv[1], 'a').write(json.dumps({k: v for k, v in os.environ.items() "
              "if k.startswith('CLUSTERCTL_')}) + '\\n')")


class Cli:
    """`clusterctl` with this test's state dir and extra environment (the webhook_env variable)."""

    def __init__(self, state_dir: Path, env: dict[str, str]):
        self.state_dir, self.env, self.outputs = state_dir, env, []

    def argv(self, *args: str) -> list[str]:
        return [*rh.CLUSTERCTL, "--state-dir", str(self.state_dir), *args]

    def environ(self) -> dict[str, str]:
        return {**os.environ, "CLUSTERCTL_STATE_DIR": str(self.state_dir), "COLUMNS": "80", **self.env}

    def __call__(self, *args: str, timeout: float = 120, rc: int | None = 0) -> subprocess.CompletedProcess:
        p = subprocess.run(self.argv(*args), capture_output=True, text=True, timeout=timeout, env=self.environ(),
                           cwd=str(rh.REPO), stdin=subprocess.DEVNULL)
        self.outputs.append(p.stdout + p.stderr)
        if rc is not None:
            assert p.returncode == rc, f"clusterctl {' '.join(args)} -> {p.returncode}:\n{p.stdout}\n{p.stderr}"
        return p

    def popen(self, *args: str, out: Path) -> subprocess.Popen:
        return subprocess.Popen(self.argv(*args), stdout=open(out, "w"), stderr=subprocess.STDOUT,
                                env=self.environ(), cwd=str(rh.REPO), stdin=subprocess.DEVNULL)


def _stop_supervisors(cli: Cli, name: str) -> None:
    st = cli("status", name, "-o", "json", rc=None, timeout=30)
    if st.returncode == 0 and json.loads(st.stdout).get("supervisor_pid"):
        cli("stop", name, "--grace", "0", rc=None, timeout=120)


def _job(tb, tmp_path: Path, name: str, **kw) -> tuple[Path, Path, Path]:
    shared = Path(tb.shared) / name
    shared.mkdir(parents=True, exist_ok=True)
    inv = tb.inventory(tmp_path / "inventory.yaml", runtime="podman", hosts=HOSTS)
    data = yaml.safe_load(inv.read_text())     # CPU hosts: the session testbed's GPUs are stubs (no usable CDI)
    for hv in data["all"]["hosts"].values():
        hv["clusterctl_gpus"] = 0
    data["all"]["vars"]["clusterctl_gpus"] = 0
    inv.write_text(yaml.safe_dump(data, sort_keys=False))
    job = rh.job_yaml(tmp_path / "job.yaml", shared, name=name, **kw)
    return inv, job, shared


def test_notifications_history_and_automatic_cordon(testbed, tmp_path):
    tb = testbed
    hook = tb.host("node6")          # the webhook receiver: a real HTTP server on another testbed host
    hooks = tmp_path / "hooks.jsonl"
    receiver = subprocess.Popen(["nsenter", f"--net=/run/netns/{hook.ns}", sys.executable, "-c", RECEIVER,
                                 str(HOOK_PORT), str(hooks)], stdin=subprocess.DEVNULL)
    secrets = ["SECRET-TOKEN-LITERAL", "SECRET-TOKEN-ENV", "SECRET-TOKEN-FAIL"]
    base = f"http://{hook.address}:{HOOK_PORT}"
    name = "tkbnotify"
    inv, job, shared = _job(tb, tmp_path, name, steps=60, supervisor={"cordon_after": 1})
    spec = yaml.safe_load(job.read_text())
    spec["hosts"] = HOSTS
    spec["notify"] = [
        {"webhook": f"{base}/hook/{secrets[0]}", "on": ["started", "recovering", "failed", "succeeded"],
         "allow_http": True},                   # the testbed's receiver speaks plain http (issue 24: opt in)
        {"webhook_env": "CC_TEST_HOOK", "on": ["succeeded"], "allow_http": True},
        {"webhook": f"{base}/fail/{secrets[2]}", "on": ["succeeded"], "allow_http": True},
        {"command": [sys.executable, "-c", RECORD_ENV, str(tmp_path / "command.jsonl")],
         "on": ["recovering", "succeeded"]},
    ]
    job.write_text(yaml.safe_dump(spec, sort_keys=False))
    cli = Cli(tmp_path / "state", {"CC_TEST_HOOK": f"{base}/env/{secrets[1]}"})
    run = rh.Run(tb, tmp_path / "state", inv, job, name, 60, shared / "steps.jsonl")
    watchers: list[subprocess.Popen] = []
    try:
        plan = cli("launch", str(job), "-i", str(inv), "--dry-run")
        assert "notify     webhook *** on started,recovering,failed,succeeded" in plan.stdout
        cli("launch", str(job), "-i", str(inv), "--detach", "--skip-preflight", timeout=60)
        watchers = [cli.popen("status", name, "--watch", out=tmp_path / "watch.txt"),
                    cli.popen("events", name, "-f", out=tmp_path / "events.txt")]
        run.wait_step(20)
        victim = rh.other_host(run)
        assert tb.kill(victim, pattern=rh.JOB_PATTERN)
        st = run.wait_end(300)
        assert st["state"] == "SUCCEEDED", run.events_text()
        job_id = st["job_id"]
        for w in watchers:                        # both end by themselves once the job has ended
            assert w.wait(timeout=30) == 0

        # --- notifications: the real HTTP server got the JSON payloads ---------------------------------------
        got = [json.loads(line) for line in hooks.read_text().splitlines()]
        literal = [g["body"] for g in got if g["path"] == f"/hook/{secrets[0]}"]
        assert [(p["event"], p["attempt"]) for p in literal] == [
            ("started", 1), ("recovering", 1), ("started", 2), ("succeeded", 2)], literal
        rec = literal[1]
        assert list(rec) == ["job", "job_id", "event", "state", "reason", "attempt", "node", "checkpoint_step",
                             "time", "text"]
        assert (rec["job"], rec["job_id"], rec["state"], rec["node"]) == (name, job_id, "RECOVERING", victim)
        assert victim in rec["reason"] and rec["text"].startswith(f"clusterctl: job {name} RECOVERING")
        assert literal[3]["state"] == "SUCCEEDED" and 10 <= literal[3]["checkpoint_step"] <= 60
        assert all(g["type"] == "application/json" for g in got)
        assert [g["body"]["event"] for g in got if g["path"] == f"/env/{secrets[1]}"] == ["succeeded"]
        assert [g["body"]["event"] for g in got if g["path"].startswith("/fail/")] == ["succeeded"] * 3  # 3 tries
        events = json.loads(cli("events", name, "-o", "json").stdout)
        failed = [e for e in events if e["kind"] == "notify_failed"]
        assert len(failed) == 1 and "notify[2] webhook ***" in failed[0]["message"]
        assert "HTTP 500" in failed[0]["message"]
        cmd = [json.loads(line) for line in (tmp_path / "command.jsonl").read_text().splitlines()]
        assert [(c["CLUSTERCTL_EVENT"], c["CLUSTERCTL_STATE"]) for c in cmd] == [
            ("recovering", "RECOVERING"), ("succeeded", "SUCCEEDED")]
        assert cmd[0]["CLUSTERCTL_NODE"] == victim and cmd[0]["CLUSTERCTL_JOB_ID"] == job_id

        # --- the supervisor cordoned the lost host (cordon_after: 1) ----------------------------------------
        cordon = [e for e in events if e["kind"] == "cordon"]
        assert len(cordon) == 1 and cordon[0]["node"] == victim, events
        nodes = {r["host"]: r for r in json.loads(cli("nodes", "-i", str(inv), "-o", "json").stdout)}
        assert nodes[victim]["state"] == "cordoned" and nodes[victim]["by"] == f"supervisor (job {job_id})"
        assert nodes[victim]["failures_7d"] == {"node_lost": 1} and nodes[victim]["last_failure"]["job_id"] == job_id
        assert all(nodes[h]["state"] == "ok" and nodes[h]["jobs"] == 1 for h in HOSTS if h != victim)
        text = cli("nodes", "-i", str(inv)).stdout
        assert victim in text and "cordoned" in text
        plan = cli("launch", str(job), "-i", str(inv), "--dry-run").stdout
        assert f"excluded   {victim}: cordoned: 1 infrastructure failures within 24 h" in plan
        cli("uncordon", victim)
        assert json.loads(cli("nodes", "-i", str(inv), "-o", "json").stdout)[HOSTS.index(victim)]["state"] == "ok"

        # --- history: watch / events -f output, the list, filters -------------------------------------------
        watch = (tmp_path / "watch.txt").read_text().splitlines()
        states = [line.split()[1] for line in watch]
        assert states[-1] == "SUCCEEDED" and "RUNNING" in states, watch
        assert any(" attempt 1 " in line for line in watch) and any(" attempt 2 " in line for line in watch)
        assert len(watch) == len(set(watch)) <= 40                   # one line per change, not one per 2 s
        followed = (tmp_path / "events.txt").read_text()
        assert "verdict" in followed and "cordon" in followed and "job SUCCEEDED" in followed
        listing = cli("status").stdout.splitlines()
        row = next(line for line in listing if line.startswith(job_id + " "))
        assert "SUCCEEDED" in row and all(len(line) <= 80 for line in listing)
        assert [j["job_id"] for j in json.loads(cli("status", "--state", "SUCCEEDED", "--since", "1h", "-o",
                                                     "json").stdout)["jobs"]] == [job_id]
        assert json.loads(cli("status", "--state", "FAILED", "-o", "json").stdout)["jobs"] == []

        # --- the URLs are secrets: not in the DB, the logs, or any output ------------------------------------
        state_dir = tmp_path / "state"
        for path in [p for p in [*state_dir.glob("state.db*"), *state_dir.glob("jobs/*/*")] if p.is_file()]:
            data = path.read_bytes()
            assert not any(s.encode() in data for s in secrets), path
        assert not any(s in o for s in secrets for o in cli.outputs)
        assert not any(s in (tmp_path / f).read_text() for s in secrets for f in ("watch.txt", "events.txt"))

        # --- forget: records and controller-side logs go, checkpoints stay -----------------------------------
        ckpts = sorted(p.name for p in (shared / "ckpt").iterdir())
        assert ckpts
        out = cli("forget", job_id).stderr
        assert f"forgot {job_id}" in out
        assert not (state_dir / "jobs" / job_id).exists()
        assert cli("status", job_id, rc=2).returncode == 2
        assert sorted(p.name for p in (shared / "ckpt").iterdir()) == ckpts
    finally:
        for w in watchers:
            if w.poll() is None:
                w.kill()
                w.wait()
        _stop_supervisors(cli, name)
        receiver.send_signal(signal.SIGTERM)
        receiver.wait(timeout=10)


def test_cordoned_hosts_are_skipped_by_launch_and_resume(testbed, tmp_path):
    tb = testbed
    name = "tkbcordon"
    inv, job, shared = _job(tb, tmp_path, name, steps=400, step_time=0.1)
    spec = yaml.safe_load(job.read_text())
    spec["hosts"] = HOSTS
    job.write_text(yaml.safe_dump(spec, sort_keys=False))
    cli = Cli(tmp_path / "state", {})
    run = rh.Run(tb, tmp_path / "state", inv, job, name, 400, shared / "steps.jsonl")
    try:
        cli("cordon", "node2", "--reason", "flaky NIC")
        out = cli("launch", str(job), "-i", str(inv), "--detach", "--skip-preflight", timeout=60).stderr
        assert "excluded node2: cordoned: flaky NIC" in out
        st = run.wait_attempt(1, timeout=90)
        assert [n["node"] for n in st["nodes"]] == ["node1", "node3"]
        assert not [c for _, c in tb.processes("node2") if "train.py" in c]
        cli("stop", name, "--grace", "0", timeout=120)
        run.wait_end(60)
        cli("cordon", "node3", "--reason", "fan failure")
        r = cli("resume", name, "--detach", rc=2)
        assert "node2 (flaky NIC)" in r.stderr and "node3 (fan failure)" in r.stderr and "at least 2" in r.stderr
        assert run.status()["state"] == "STOPPED"                    # nothing was started
        cli("uncordon", "node3")
        cli("resume", name, "--detach", timeout=120)
        st = run.wait_attempt(2, timeout=90)
        assert [n["node"] for n in st["nodes"]] == ["node1", "node3"]
    finally:
        _stop_supervisors(cli, name)
        rh.check_clean(run)
