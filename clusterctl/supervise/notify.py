"""Notifications: the job key ``notify:`` -> a webhook POST or a command on the controller for every state change.

Events: ``started`` (an attempt is RUNNING), ``recovering``, ``failed``, ``succeeded``, ``stopped``. The
supervisor's ``Store.on_state`` hook calls ``Notifier.on_state``, which only builds the payload and queues it: one
background thread delivers (5 s per try, an overall deadline; 3 tries with exponential backoff, by tenacity), so a
slow, dead or dripping endpoint never delays detection or a relaunch. Webhooks are https:// unless the entry sets
``allow_http: true``; a command gets a minimal environment (``COMMAND_ENV_KEEP`` and the ``CLUSTERCTL_*`` values). A delivery that fails every try is an event ``notify_failed``.

A webhook URL is a secret: it is never printed (``***`` in the plan), stored (the state DB holds ``***``; the
supervisor reads the URL from the job file, or from ``$webhook_env`` in its environment) or logged (error messages
name the target by its index, and the store redacts the URL from every event).
"""
from __future__ import annotations

import datetime
import json
import os
import queue
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping, Sequence

from tenacity import Retrying, stop_after_attempt, wait_exponential

from clusterctl.config.spec import webhook_problem
from clusterctl.model.events import EventKind
from clusterctl.model.verdicts import INFRA
from clusterctl.store.ledger import Ledger
from clusterctl.store.state import JobState, Store

TIMEOUT_S = 5.0
TRIES = 3
INFRA_KLASSES = tuple(v.value for v in INFRA)   # charged to restarts.max_node_failures
EVENT_OF = {JobState.RUNNING: "started", JobState.RECOVERING: "recovering", JobState.FAILED: "failed",
            JobState.SUCCEEDED: "succeeded", JobState.STOPPED: "stopped"}
PAYLOAD_KEYS = ("job", "job_id", "event", "state", "reason", "attempt", "node", "checkpoint_step", "time", "text")


@dataclass(frozen=True)
class Target:
    index: int                       # position in the job's notify: list (names the target in messages)
    on: frozenset[str]
    url: str | None = None           # webhook (a secret)
    argv: tuple[str, ...] = ()       # command

    @property
    def label(self) -> str:
        return f"notify[{self.index}] " + ("webhook ***" if self.url is not None else f"command {self.argv[0]}")


class DeliveryError(Exception):
    """One failed try; the message never contains the webhook URL."""


# ------------------------------------------------------------------------------------------------ pure parts
def resolve(spec_targets: Sequence[Any], environ: Mapping[str, str],
            file_targets: Sequence[Any] | None = None) -> tuple[list[Target], list[str]]:
    """Targets ready to deliver, and a problem line for each one that is not. ``file_targets``: the notify list
    of the job file, where a stored spec's ``***`` webhook URL is read from (None: the file could not be read)."""
    targets, problems = [], []
    for i, t in enumerate(spec_targets):
        on = frozenset(t.on)
        if t.command is not None:
            targets.append(Target(i, on, argv=tuple(t.command)))
        elif t.webhook_env is not None:
            url = environ.get(t.webhook_env, "")
            why = webhook_problem(url, getattr(t, "allow_http", False)) if url else None
            if why:
                problems.append(f"notify[{i}]: ${t.webhook_env} {why}")
            elif url:
                targets.append(Target(i, on, url=url))
            else:
                problems.append(f"notify[{i}]: ${t.webhook_env} is not set in the supervisor's environment")
        else:
            url = t.webhook.get_secret_value()
            ft = None
            if url == "***":     # stored spec: the URL is in the job file only
                ft = file_targets[i] if file_targets is not None and i < len(file_targets) else None
                url = ft.webhook.get_secret_value() if ft is not None and ft.webhook is not None else "***"
            why = webhook_problem(url, getattr(ft, "allow_http", False) or getattr(t, "allow_http", False)) \
                if url != "***" else None
            if url == "***":
                problems.append(f"notify[{i}]: the webhook URL could not be read from the job file "
                                "(moved or edited?); use webhook_env to keep it out of the file")
            elif why:
                problems.append(f"notify[{i}]: the webhook {why}")
            else:
                targets.append(Target(i, on, url=url))
    return targets, problems


def iso(t: float) -> str:
    return datetime.datetime.fromtimestamp(t, datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def build_payload(*, job: str, job_id: str, event: str, state: str, reason: str | None, attempt: int,
                  node: str | None, checkpoint_step: int | None, now: float) -> dict[str, Any]:
    """The webhook body. ``text`` is one human line (Slack/Mattermost incoming webhooks show it as is)."""
    text = f"clusterctl: job {job} {event.upper()}" + (f" (attempt {attempt})" if attempt else "")
    if reason:
        text += f": {reason}"
    if checkpoint_step is not None:
        text += f"; latest checkpoint step {checkpoint_step}"
    text += f" [{job_id}]"
    return {"job": job, "job_id": job_id, "event": event, "state": state, "reason": reason, "attempt": attempt,
            "node": node, "checkpoint_step": checkpoint_step, "time": iso(now), "text": text}


# What a notify command gets of the supervisor's environment (issue 24: it had all of it: secret_env values, webhook
# URLs, SSH_AUTH_SOCK). Nothing else: a command that needs a token reads it itself (a wrapper script, a file).
COMMAND_ENV_KEEP = ("PATH", "HOME", "USER", "LOGNAME", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "TMPDIR")


def command_env(payload: Mapping[str, Any], base: Mapping[str, str]) -> dict[str, str]:
    """The variables of ``base`` in ``COMMAND_ENV_KEEP`` (PATH defaults to /usr/bin:/bin) plus
    ``CLUSTERCTL_<KEY>`` for every payload key (None -> empty)."""
    env = {k: base[k] for k in COMMAND_ENV_KEEP if k in base}
    env.setdefault("PATH", "/usr/local/bin:/usr/bin:/bin")
    for k in PAYLOAD_KEYS:
        v = payload.get(k)
        env[f"CLUSTERCTL_{k.upper()}"] = "" if v is None else str(v)
    return env


# ------------------------------------------------------------------------------------------------ delivery
def post_webhook(url: str, payload: Mapping[str, Any], timeout_s: float = TIMEOUT_S) -> None:
    """POST ``payload`` as JSON. ``timeout_s`` bounds the whole delivery (connect, send, the answer), not each
    socket operation (issue 24: a server dripping a byte every few seconds held the one delivery thread): at the
    deadline the connection's socket is shut down, which ends any read or write in progress."""
    body = json.dumps(payload).encode()
    req = urllib.request.Request(url, data=body, method="POST",
                                 headers={"Content-Type": "application/json", "User-Agent": "clusterctl"})
    conns: list = []
    expired = threading.Event()

    def expire() -> None:
        expired.set()
        for sock in list(conns):
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    timer = threading.Timer(timeout_s, expire)
    timer.daemon = True
    timer.start()
    try:
        with _opener(conns, expired).open(req, timeout=timeout_s) as resp:   # noqa: S310 - https (http if allowed) only
            resp.read(65536)
    except urllib.error.HTTPError as e:
        raise DeliveryError(f"HTTP {e.code}") from None
    except Exception as e:  # noqa: BLE001 - a socket shut down under any layer (TLS too) may fail in any way
        if expired.is_set() or isinstance(e, TimeoutError) or isinstance(getattr(e, "reason", None), TimeoutError):
            raise DeliveryError(f"no complete answer within {timeout_s:g}s") from None
        if isinstance(e, urllib.error.URLError):   # its reason may quote the URL: only the OS error's text is kept
            raise DeliveryError(getattr(e.reason, "strerror", None) or "cannot connect") from None
        if isinstance(e, OSError):
            raise DeliveryError(e.strerror or type(e).__name__) from None
        raise DeliveryError(type(e).__name__) from None
    finally:
        timer.cancel()
    if expired.is_set():
        raise DeliveryError(f"no complete answer within {timeout_s:g}s")


class _Tracking:
    """A urllib handler that keeps the socket of every connection it opens in ``conns`` (so a deadline can shut it
    down; urllib drops the connection's own reference once the answer's headers are read)."""

    conns: list
    expired: threading.Event

    def do_open(self, http_class, req, **kw):
        def make(*a, **k):
            c = http_class(*a, **k)
            connect = c.connect

            def tracked() -> None:
                connect()
                self.conns.append(c.sock)
                if self.expired.is_set():           # the deadline passed while connecting
                    c.sock.shutdown(socket.SHUT_RDWR)
            c.connect = tracked
            return c
        return super().do_open(make, req, **kw)


class _HTTP(_Tracking, urllib.request.HTTPHandler):
    pass


class _HTTPS(_Tracking, urllib.request.HTTPSHandler):
    pass


def _opener(conns: list, expired: threading.Event) -> urllib.request.OpenerDirector:
    handlers = [_HTTP(), _HTTPS()]
    for h in handlers:
        h.conns, h.expired = conns, expired
    return urllib.request.build_opener(*handlers)


def run_command(argv: Sequence[str], payload: Mapping[str, Any], timeout_s: float = TIMEOUT_S) -> None:
    try:
        p = subprocess.run(list(argv), env=command_env(payload, os.environ), stdin=subprocess.DEVNULL,
                           capture_output=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise DeliveryError(f"still running after {timeout_s:g}s (killed)") from None
    except OSError as e:
        raise DeliveryError(f"cannot run {argv[0]}: {e.strerror or e}") from None
    if p.returncode != 0:
        tail = p.stderr.decode(errors="replace").strip().splitlines()[-1:] or [""]
        raise DeliveryError(f"exited with code {p.returncode}" + (f": {tail[0][:200]}" if tail[0] else ""))


class Notifier:
    """Queues one delivery per (state change, target); a daemon thread delivers them in order."""

    def __init__(self, store: Store, job_id: str, targets: Iterable[Target], *,
                 post: Callable[..., None] = post_webhook, run: Callable[..., None] = run_command,
                 timeout_s: float = TIMEOUT_S, tries: int = TRIES, backoff_s: float = 1.0,
                 sleep: Callable[[float], None] = time.sleep, clock: Callable[[], float] = time.time,
                 budgets: tuple[int, int] | None = None):
        """``budgets``: (restarts.max_failures, restarts.max_node_failures); with them, a RECOVERING that is about
        to become FAILED (the failure exhausts its budget) is not announced as ``recovering``: ``failed`` follows."""
        self.store, self.job_id, self.targets = store, job_id, list(targets)
        self._post, self._run, self._timeout_s, self._tries = post, run, timeout_s, tries
        self._backoff_s, self._sleep, self._clock, self._budgets = backoff_s, sleep, clock, budgets
        self._queue: queue.Queue = queue.Queue()
        self._last: JobState | None = store.get_job(job_id).state
        self._thread: threading.Thread | None = None
        store.add_secrets(t.url for t in self.targets if t.url)

    # called by Store.set_state (the supervisor's thread): cheap, never blocks on the network
    def on_state(self, job_id: str, old: JobState, new: JobState) -> None:
        if job_id != self.job_id or new == self._last:
            return
        self._last = new
        event = EVENT_OF.get(new)
        wanted = [t for t in self.targets if event in t.on]
        if not wanted or (event == "recovering" and self._exhausted()):
            return
        payload = self.payload(event)
        for t in wanted:
            self._queue.put((t, payload))
        if self._thread is None:
            self._thread = threading.Thread(target=self._work, name="clusterctl-notify", daemon=True)
            self._thread.start()

    def _exhausted(self) -> bool:
        """Whether the failure just recorded spends the last restart of its budget (the job fails next)."""
        if self._budgets is None:
            return False
        verdict = next((e for e in reversed(self.store.events(self.job_id)) if e.kind == EventKind.VERDICT), None)
        if verdict is None or verdict.klass is None:
            return False
        job = self.store.get_job(self.job_id)
        infra = verdict.klass in INFRA_KLASSES
        used, budget = ((job.node_failures_used, self._budgets[1]) if infra else
                        (job.failures_used, self._budgets[0]))
        return used + 1 > budget

    def payload(self, event: str) -> dict[str, Any]:
        job = self.store.get_job(self.job_id)
        events = self.store.events(self.job_id)
        node = None
        if event in ("recovering", "failed"):
            failure = next((e for e in reversed(events) if e.kind in (EventKind.VERDICT, EventKind.START_FAILED)), None)
            node = failure.node if failure else None
        step = next((e.checkpoint_step for e in reversed(events) if e.kind == EventKind.CHECKPOINT), None)
        if step is None:
            attempts = self.store.attempts(self.job_id)
            step = attempts[-1].checkpoint_step if attempts else None
        return build_payload(job=job.name, job_id=job.job_id, event=event, state=job.state.value,
                             reason=job.reason, attempt=job.attempt, node=node, checkpoint_step=step,
                             now=self._clock())

    def _work(self) -> None:
        while True:
            item = self._queue.get()
            try:
                if item is None:
                    return
                self._deliver(*item)
            finally:
                self._queue.task_done()

    def _deliver(self, target: Target, payload: dict[str, Any]) -> None:
        def once() -> None:
            if target.url is not None:
                self._post(target.url, payload, self._timeout_s)
            else:
                self._run(target.argv, payload, self._timeout_s)

        try:
            for attempt in Retrying(stop=stop_after_attempt(self._tries), sleep=self._sleep, reraise=True,
                                    wait=wait_exponential(multiplier=self._backoff_s, max=8 * self._backoff_s)):
                with attempt:
                    once()
        except Exception as e:  # noqa: BLE001 - every failure becomes an event, never a crash of the supervisor
            why = str(e) if isinstance(e, DeliveryError) else type(e).__name__
            try:
                Ledger(self.store).event(self.job_id, EventKind.NOTIFY_FAILED,
                                         f"{target.label}: {payload['event']!r} not delivered after {self._tries} "
                                         f"tries: {why}", attempt=payload.get("attempt") or None)
            except Exception:  # noqa: BLE001 - the store may be closing
                pass

    def problem(self, message: str) -> None:
        Ledger(self.store).event(self.job_id, EventKind.NOTIFY_FAILED, message)

    def close(self, timeout_s: float = 60.0) -> None:
        """Wait (bounded) for queued deliveries, e.g. the final ``failed``/``succeeded``, then stop the thread."""
        if self._thread is None:
            return
        self._queue.put(None)
        self._thread.join(timeout_s)


def for_job(store: Store, job_id: str, spec: Any, environ: Mapping[str, str] = os.environ) -> Notifier:
    """The job's notifier (no targets: it does nothing), hooked on ``store.on_state``."""
    file_targets = None
    if any(t.webhook is not None for t in spec.notify):
        from clusterctl.config.spec import load_job

        try:
            source = json.loads(store.get_job(job_id).spec_json).get("source") or ""
            file_targets = load_job(source).notify
        except Exception:  # noqa: BLE001 - reported as notify_failed below
            file_targets = None
    targets, problems = resolve(spec.notify, environ, file_targets)
    notifier = Notifier(store, job_id, targets,
                        budgets=(spec.restarts.max_failures, spec.restarts.max_node_failures))
    for p in problems:
        notifier.problem(p)
    store.on_state = notifier.on_state
    return notifier
