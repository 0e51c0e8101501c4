"""notify: parsing of the job key, the payload, resolution of URLs, delivery with retries (fake and real HTTP)."""
import http.server
import json
import threading
import time

import pytest

from clusterctl.config.spec import loads_job
from clusterctl.errors import InputError
from clusterctl.store.state import JobState, Store
from clusterctl.supervise import notify

URL = "https://127.0.0.1:9/hooks/T0-SECRET-TOKEN"


def job(notify_yaml: str):
    return loads_job("name: demo\nscript: train.py\nnotify:\n" + notify_yaml)


def test_parse_targets_defaults_and_on_key_is_not_a_boolean():
    spec = job(f"  - {{webhook: {URL}}}\n  - webhook_env: HOOK\n    on: [started, stopped]\n"
               "  - {command: [page, --team, ml], on: [succeeded]}\n")
    assert [t.on for t in spec.notify] == [["failed", "recovering"], ["started", "stopped"], ["succeeded"]]
    assert spec.notify[0].webhook.get_secret_value() == URL
    assert spec.notify[2].command == ["page", "--team", "ml"]
    # the URL never leaves the spec: the stored form and the plan description hold ***
    assert URL not in json.dumps(spec.model_dump(mode="json"))
    assert [t.describe() for t in spec.notify] == [
        "webhook *** on failed,recovering", "webhook from $HOOK on started,stopped",
        "command page --team ml on succeeded"]


@pytest.mark.parametrize("entry,message", [
    ("  - {webhook: ftp://host/x}\n", "notify[0].webhook: must be an http:// or https:// URL"),
    ("  - {webhook_env: HOOK, command: [x]}\n", "exactly one of webhook, webhook_env or command"),
    ("  - {}\n", "exactly one of webhook, webhook_env or command"),
    ("  - {command: [x], on: [boom]}\n", "notify[0].on[0]: must be one of"),
    ("  - {command: [x], on: []}\n", "must name at least one event"),
    ("  - {command: [x], on: [failed, failed]}\n", "failed listed more than once"),
    ("  - {command: []}\n", "non-empty argv"),
    ("  - {webhook_env: 1BAD}\n", "invalid environment variable name"),
    ("  - {webhook: 'http://h/x', when: [failed]}\n", "unknown key 'when'"),
])
def test_parse_errors_name_the_line(entry, message):
    with pytest.raises(InputError) as e:
        job(entry)
    assert str(e.value).startswith("<job>:4: ") and message in str(e.value)
    assert "ftp://host/x" not in str(e.value)          # a webhook value is never echoed


def test_resolve_reads_stored_urls_from_the_job_file_and_env():
    spec = job(f"  - {{webhook: {URL}}}\n  - {{webhook_env: HOOK}}\n  - {{command: ['true']}}\n")
    stored = loads_job(json.dumps({"name": "demo", "script": "t.py", **spec.model_dump(mode="json",
                                                                                        include={"notify"})}))
    assert stored.notify[0].webhook.get_secret_value() == "***"
    targets, problems = notify.resolve(stored.notify, {"HOOK": "https://h/2"}, spec.notify)
    assert [(t.index, t.url, t.argv) for t in targets] == [(0, URL, ()), (1, "https://h/2", ()), (2, None, ("true",))]
    assert problems == []
    targets, problems = notify.resolve(stored.notify, {}, None)
    assert [t.index for t in targets] == [2]
    assert len(problems) == 2 and "$HOOK is not set" in problems[1] and URL not in " ".join(problems)


def test_payload_and_command_env():
    p = notify.build_payload(job="demo", job_id="demo-1", event="recovering", state="RECOVERING",
                             reason="node n2 lost", attempt=2, node="n2", checkpoint_step=40, now=0)
    assert tuple(p) == notify.PAYLOAD_KEYS
    assert p["time"] == "1970-01-01T00:00:00Z"
    assert p["text"] == "clusterctl: job demo RECOVERING (attempt 2): node n2 lost; latest checkpoint step 40 [demo-1]"
    env = notify.command_env(p, {"PATH": "/bin"})
    assert env["CLUSTERCTL_EVENT"] == "recovering" and env["CLUSTERCTL_STATE"] == "RECOVERING"
    assert env["CLUSTERCTL_REASON"] == "node n2 lost" and env["CLUSTERCTL_CHECKPOINT_STEP"] == "40"
    assert env["CLUSTERCTL_NODE"] == "n2" and env["PATH"] == "/bin"


@pytest.fixture
def store(tmp_path):
    s = Store(tmp_path / "state.db")
    yield s
    s.close()


def _drive(store, notifier, job_id):
    store.on_state = notifier.on_state
    for st in (JobState.STARTING, JobState.RUNNING, JobState.RECOVERING, JobState.STARTING, JobState.RUNNING):
        store.set_state(job_id, st, "node n2 lost" if st == JobState.RECOVERING else None)
    store.set_state(job_id, JobState.FAILED, "budget exhausted")
    store.set_state(job_id, JobState.FAILED, "budget exhausted")     # same state again: no second notification
    notifier.close(timeout_s=10)


def test_events_filtered_by_on_and_failed_delivery_is_an_event(store):
    job_id = store.create_job("demo", "{}", None, None)
    posted, calls, sleeps = [], [], []

    def post(url, payload, timeout_s):
        calls.append((url, payload["event"], timeout_s))
        if payload["event"] == "failed":
            raise notify.DeliveryError("HTTP 500")
        posted.append(payload)

    targets = [notify.Target(0, frozenset({"started", "recovering", "failed"}), url=URL)]
    n = notify.Notifier(store, job_id, targets, post=post, sleep=sleeps.append)
    _drive(store, n, job_id)
    assert [p["event"] for p in posted] == ["started", "recovering", "started"]
    assert [p["attempt"] for p in posted] == [0, 0, 0]
    assert [c[1] for c in calls].count("failed") == 3 and all(c[2] == 5.0 for c in calls)   # 3 tries, 5 s each
    assert len(sleeps) == 2 and sleeps[0] < sleeps[1]                                        # backoff between
    failed = [e for e in store.events(job_id) if e.kind == "notify_failed"]
    assert len(failed) == 1 and "notify[0] webhook ***" in failed[0].message and "HTTP 500" in failed[0].message
    assert "not delivered after 3 tries" in failed[0].message


def test_on_state_never_waits_for_delivery(store):
    job_id = store.create_job("demo", "{}", None, None)
    gate = threading.Event()
    n = notify.Notifier(store, job_id, [notify.Target(0, frozenset({"started"}), url=URL)],
                        post=lambda *a: gate.wait(10))
    store.on_state = n.on_state
    store.set_state(job_id, JobState.STARTING)
    t0 = time.monotonic()
    store.set_state(job_id, JobState.RUNNING)      # the endpoint hangs: the supervisor does not
    assert time.monotonic() - t0 < 0.5
    gate.set()
    n.close(timeout_s=10)


class _Hook(http.server.BaseHTTPRequestHandler):
    got: list = []
    status = 200

    def do_POST(self):  # noqa: N802
        body = self.rfile.read(int(self.headers["Content-Length"]))
        type(self).got.append((self.path, self.headers["Content-Type"], json.loads(body)))
        self.send_response(type(self).status)
        self.end_headers()

    def log_message(self, *a):
        pass


def test_real_http_post_and_error_without_the_url():
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Hook)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{srv.server_address[1]}/hooks/SECRET"
    try:
        payload = notify.build_payload(job="j", job_id="j-1", event="failed", state="FAILED", reason="r",
                                       attempt=1, node=None, checkpoint_step=None, now=0)
        notify.post_webhook(url, payload)
        assert _Hook.got == [("/hooks/SECRET", "application/json", payload)]
        _Hook.status = 503
        with pytest.raises(notify.DeliveryError) as e:
            notify.post_webhook(url, payload)
        assert str(e.value) == "HTTP 503"
    finally:
        srv.shutdown()
    with pytest.raises(notify.DeliveryError) as e:
        notify.post_webhook(url, payload, timeout_s=2)      # nothing listens any more
    assert "SECRET" not in str(e.value) and "127.0.0.1" not in str(e.value)


def test_command_target_gets_the_event_in_its_environment(tmp_path):
    out = tmp_path / "got"
    p = notify.build_payload(job="j", job_id="j-1", event="stopped", state="STOPPED", reason="stopped by user",
                             attempt=3, node=None, checkpoint_step=None, now=0)
    notify.run_command(["sh", "-c", f'echo "$CLUSTERCTL_EVENT|$CLUSTERCTL_REASON|$CLUSTERCTL_ATTEMPT" > {out}'], p)
    assert out.read_text() == "stopped|stopped by user|3\n"
    with pytest.raises(notify.DeliveryError, match="exited with code 3: boom"):
        notify.run_command(["sh", "-c", "echo boom >&2; exit 3"], p)
    with pytest.raises(notify.DeliveryError, match="killed"):
        notify.run_command(["sleep", "5"], p, timeout_s=0.3)


def test_a_failure_that_exhausts_the_budget_is_announced_as_failed_only(store):
    job_id = store.create_job("demo", "{}", None, None)
    posted = []
    n = notify.Notifier(store, job_id, [notify.Target(0, frozenset({"recovering", "failed"}), url=URL)],
                        post=lambda url, p, t: posted.append((p["event"], p["attempt"])), budgets=(1, 10))
    store.on_state = n.on_state
    for attempt in (1, 2):
        store.start_attempt(job_id, attempt, "n1", "r", ["n1"])
        store.set_state(job_id, JobState.STARTING)
        store.set_state(job_id, JobState.RUNNING)
        store.add_event(job_id, "verdict", "rank 0 exited with code 1", klass="user_error", attempt=attempt)
        store.set_state(job_id, JobState.RECOVERING, "rank 0 exited with code 1")
        store.update_job(job_id, failures_used=attempt)
    store.set_state(job_id, JobState.FAILED, "budget exhausted")
    n.close(timeout_s=10)
    assert posted == [("recovering", 1), ("failed", 2)]


# ------------------------------------------------------------------------------------------------ issue 24
def test_plain_http_webhook_needs_allow_http():
    """Items 12: https:// only, unless the notify entry sets ``allow_http: true``; the URL is never echoed."""
    with pytest.raises(InputError) as e:
        job("  - {webhook: 'http://h/SECRET'}\n")
    assert "allow_http: true" in str(e.value) and "SECRET" not in str(e.value)
    spec = job("  - {webhook: 'http://h/SECRET', allow_http: true}\n  - {webhook_env: HOOK}\n"
               "  - {webhook_env: HOOK, allow_http: true}\n")
    targets, problems = notify.resolve(spec.notify, {"HOOK": "http://h/ENVSECRET"})
    assert [t.index for t in targets] == [0, 2]
    assert len(problems) == 1 and problems[0].startswith("notify[1]: $HOOK is a plain http:// URL")
    assert "ENVSECRET" not in problems[0]
    targets, problems = notify.resolve(spec.notify, {"HOOK": "file:///etc/passwd"})
    assert [t.index for t in targets] == [0] and len(problems) == 2


def test_launch_refuses_a_plain_http_webhook_env(tmp_path):
    from clusterctl.usecases.context import check_environment

    f = tmp_path / "job.yaml"
    f.write_text("name: demo\nscript: train.py\nnotify:\n  - {webhook_env: HOOK}\n")
    spec = loads_job(f.read_text())
    with pytest.raises(InputError) as e:
        check_environment(str(f), spec, {"HOOK": "http://h/ENVSECRET"})
    assert f"{f}:4" in str(e.value) and "allow_http" in str(e.value) and "ENVSECRET" not in str(e.value)
    check_environment(str(f), spec, {"HOOK": "https://h/ENVSECRET"})


def test_command_gets_a_minimal_environment(tmp_path, monkeypatch):
    """Item 12: the supervisor's secrets, webhook URLs and SSH agent never reach a notify command."""
    for k, v in {"SSH_AUTH_SOCK": "/tmp/agent.sock", "HF_TOKEN": "hf-SECRET", "SLACK_HOOK": "https://h/SECRET",
                 "AWS_SECRET_ACCESS_KEY": "aws-SECRET", "LANG": "C.UTF-8"}.items():
        monkeypatch.setenv(k, v)
    out = tmp_path / "env"
    p = notify.build_payload(job="j", job_id="j-1", event="failed", state="FAILED", reason="r", attempt=1,
                             node=None, checkpoint_step=None, now=0)
    notify.run_command(["sh", "-c", f"env > {out}"], p)
    env = dict(line.split("=", 1) for line in out.read_text().splitlines() if "=" in line)
    assert "SECRET" not in out.read_text() and "SSH_AUTH_SOCK" not in env
    assert env["LANG"] == "C.UTF-8" and env["CLUSTERCTL_EVENT"] == "failed" and env["PATH"]
    assert set(env) - {k for k in env if k.startswith("CLUSTERCTL_")} <= set(notify.COMMAND_ENV_KEEP) | {
        "PWD", "SHLVL", "_", "OLDPWD"}


def test_webhook_timeout_bounds_the_whole_delivery():
    """Item 14: a server that drips a byte every 0.2 s never trips a per-read timeout; the delivery still ends at
    its 1 s deadline (it took as long as the server kept dripping)."""
    import socket as _socket

    srv = _socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    stop = threading.Event()

    def drip():
        conn, _ = srv.accept()
        conn.recv(65536)
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n")
        while not stop.is_set():
            try:
                conn.sendall(b"x")
            except OSError:
                break
            time.sleep(0.2)
        conn.close()

    threading.Thread(target=drip, daemon=True).start()
    p = notify.build_payload(job="j", job_id="j-1", event="failed", state="FAILED", reason="r", attempt=1,
                             node=None, checkpoint_step=None, now=0)
    box: dict = {}

    def deliver():
        t0 = time.monotonic()
        try:
            notify.post_webhook(f"http://127.0.0.1:{srv.getsockname()[1]}/SECRET", p, timeout_s=1.0)
        except notify.DeliveryError as e:
            box["error"] = str(e)
        box["s"] = time.monotonic() - t0

    th = threading.Thread(target=deliver, daemon=True)
    th.start()
    th.join(8)
    stop.set()
    srv.close()
    assert not th.is_alive(), "the delivery was held by a dripping server"
    assert box["s"] < 3 and "within 1s" in box["error"] and "SECRET" not in box["error"], box
