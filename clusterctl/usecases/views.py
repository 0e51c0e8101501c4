"""What happened and where it stands (``cli.views``): ``status`` (one job, ``--watch``, the list),
``events`` and ``logs``, and the ``Watchdog`` every follower runs while nobody supervises the job."""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Sequence

from clusterctl.errors import ClusterctlError
from clusterctl.model.events import EventKind
from clusterctl.supervise import controller
from clusterctl.transport import ConnectOptions
from clusterctl.transport import connect as default_connect
from clusterctl.usecases.base import Connect, Workspace


class Watchdog:
    """What a follower (`logs -f`, `events -f`, an attached `launch`/`resume`) does when the job's supervisor is
    gone, called every round: it says so at once with the line `status` prints (``UNSUPERVISED: ... Run:
    clusterctl resume JOB``; again if a supervisor came back and went), and while nobody supervises the active job
    it asks the nodes every ``every_s`` as `status` does: ``fill`` completes the log copy from the nodes' own logs
    (the follower prints what they printed since), and the job is reconciled (it ends when its nodes ended, and
    the follower with it). It never raises: a node that does not answer is asked again next time."""

    def __init__(self, ws: Workspace, job_id: str, say: Callable[[str], None], *,
                 options: ConnectOptions | None = None, fill: bool = False, every_s: float = 5.0,
                 connect: Connect = default_connect, clock: Callable[[], float] = time.monotonic):
        self.ws, self.job_id, self.say, self.fill, self.every_s = ws, job_id, say, fill, every_s
        self.options, self.connect, self.clock = options or ConnectOptions(), connect, clock
        self.said = self.said_error = False
        self.asked = -float("inf")

    def __call__(self) -> None:
        from clusterctl.views import status as status_mod

        job = self.ws.store.get_job(self.job_id)
        sup = controller.supervision(self.ws.root, job)
        if job.terminal or sup["supervised"]:
            self.said = False
            return
        if not self.said:
            self.said = True
            self.say(status_mod.unsupervised_line(status_mod.job_view(self.ws.store, job, supervision=sup)))
        if self.clock() - self.asked < self.every_s:
            return
        self.asked = self.clock()
        try:
            if self.fill:
                controller.fill_logs(self.ws.root, self.ws.store, self.job_id, self.options, connect=self.connect)
            controller.reconcile_job(self.ws.root, self.ws.store, self.job_id, self.options, connect=self.connect)
        except Exception as e:  # noqa: BLE001 - a follower goes on; the next look asks again
            if not self.said_error:
                self.say(f"clusterctl: could not ask the nodes: {e}")
            self.said_error = True


def status(ws: Workspace, job_ref: str, options: ConnectOptions, *, connect: Connect = default_connect) -> dict:
    """``status JOB``: the job's view; an active job that no supervisor watches is first reconciled with what its
    nodes say (bounded by the connect timeout + 5 s)."""
    from clusterctl.views import status as status_mod

    j = ws.store.get_job(job_ref)
    found = None
    if not j.terminal and not controller.supervision(ws.root, j)["supervised"]:
        found = controller.reconcile_job(ws.root, ws.store, j.job_id, options, connect=connect)
        j = ws.store.get_job(j.job_id)
    view = status_mod.job_view(ws.store, j, supervision=controller.supervision(ws.root, j))
    if found is not None and found.decision is not None:     # this look ended the job: say so first, loudly
        view["reconciled"] = {"attempt": found.attempt, "verdict": found.decision.verdict.value,
                              "message": found.decision.message, "state": found.state.value}
    return view


def job_list(ws: Workspace, *, states: Sequence[str] = (), since: str | None = None, show_all: bool = False,
             now: float | None = None, options: ConnectOptions | None = None,
             connect: Connect = default_connect) -> list[tuple[dict, dict]]:
    """``status`` without JOB: (view, row) of the active jobs, then the newest finished ones (``views.history``).
    With ``options``, an active job that no supervisor watches is reconciled first, as ``status JOB`` does (a job
    that ended while unsupervised is listed as it ended, not as RUNNING); a job whose nodes cannot be asked is
    listed as recorded."""
    from clusterctl.views import history
    from clusterctl.views import status as status_mod

    now = time.time() if now is None else now
    if options is not None:
        for j in ws.store.list_jobs():
            if not j.terminal and not controller.supervision(ws.root, j)["supervised"]:
                try:
                    controller.reconcile_job(ws.root, ws.store, j.job_id, options, connect=connect)
                except (ClusterctlError, OSError):    # a key file gone, a node unreadable: listed as recorded
                    pass
    chosen = history.select(ws.store, ws.store.list_jobs(), states=history.parse_states(states),
                            since=history.parse_since(since, now) if since else None, show_all=show_all)
    return [(status_mod.job_view(ws.store, j, now, supervision=controller.supervision(ws.root, j)),
             history.row(ws.store, j, now)) for j in chosen]


def events_view(ws: Workspace, job_ref: str) -> dict:
    """``events JOB -o json``: the job's timeline as one object."""
    from clusterctl.views import status as status_mod

    return status_mod.events_view(ws.store, ws.store.get_job(job_ref))


def follow_events(ws: Workspace, job_ref: str, show: Callable, *, follow: bool = False,
                  poll_s: float = 0.5, sleep: Callable[[float], None] = time.sleep,
                  say: Callable[[str], None] | None = None, options: ConnectOptions | None = None,
                  connect: Connect = default_connect) -> None:
    """``events JOB [-f]``: ``show(event)`` for every event in order; with ``follow``, new ones as they come
    until the job has ended and its supervisor is gone (what it wrote while it ended included). ``say``: when the
    supervisor is gone, the UNSUPERVISED line goes there and the job is reconciled now and then (``Watchdog``)."""
    j = ws.store.get_job(job_ref)
    last = 0
    watchdog = Watchdog(ws, j.job_id, say, options=options, connect=connect) if follow and say else None
    while True:
        if watchdog is not None:
            watchdog()
        for e in ws.store.events(j.job_id, after_id=last):
            show(e)
            last = e.id
        if not follow:
            return
        current = ws.store.get_job(j.job_id)
        if current.terminal and not controller.live_supervisor(ws.root, current):
            for e in ws.store.events(j.job_id, after_id=last):
                show(e)
            return
        sleep(poll_s)


@dataclass(frozen=True)
class Logs:
    lines: list[str]                    # the selected lines of the controller's copy
    missing: dict[str, str]             # node -> why its own log could not complete the copy
    follow: Callable[[Callable[[str], None]], None]    # follow(echo): new lines (and events) until the job ends


def logs(ws: Workspace, job_ref: str, options: ConnectOptions, *, node: str | None = None, rank: int | None = None,
         attempt: int | None = None, tail: int | None = None) -> Logs:
    """``logs JOB``: the controller's copy of every rank's output, completed from the nodes' own logs for any
    stretch no supervisor followed; ``UserError`` for a node/rank/attempt the job never had."""
    from clusterctl.views import logs as logs_mod

    j = ws.store.get_job(job_ref)
    sel = logs_mod.Selection.check(ws.store, j, node=node, rank=rank, attempt=attempt)
    missing = {}
    if not controller.live_supervisor(ws.root, j) and ws.store.attempts(j.job_id):
        missing = controller.fill_logs(ws.root, ws.store, j.job_id, options, attempt=attempt)
    lines = logs_mod.read(logs_mod.path(ws.root, j.job_id), sel, tail)
    stopped = [e for e in ws.store.events(j.job_id) if e.kind == EventKind.STOP]
    note = logs_mod.stop_note(ws.store.get_job(j.job_id), lines, time.strftime(
        "%Y-%m-%d %H:%M:%S UTC", time.gmtime(stopped[-1].time)) if stopped else None)
    if note and tail != 0:
        lines = [*lines[1:], note] if tail is not None and len(lines) >= tail else [*lines, note]

    def follow(echo: Callable[[str], None]) -> None:
        controller.follow(ws.root, ws.store, j.job_id,
                          lambda ln: (sel.keeps(ln) or ln.startswith("clusterctl: ")) and echo(ln), from_start=False,
                          tick=Watchdog(ws, j.job_id, echo, options=options, fill=True))
    return Logs(list(lines), dict(missing), follow)


def watch_status(ws: Workspace, job_ref: str, options: ConnectOptions, on_view: Callable[[dict], None], *,
                 interval_s: float = 2.0, sleep: Callable[[float], None] = time.sleep) -> dict:
    """``status JOB --watch``: ``on_view(view)`` every ``interval_s`` until the job has ended; its last view.
    Each look is a ``status`` (an active job nobody supervises is reconciled: the view says it is unsupervised,
    and it ends when its nodes ended)."""
    from clusterctl.views import status as status_mod

    job_id = job_id_of(ws, job_ref)
    while True:
        v = status(ws, job_id, options)
        on_view(v)
        if v["state"] in status_mod.ENDED:
            return v
        sleep(interval_s)


def job_id_of(ws: Workspace, job_ref: str) -> str:
    """The id of the job ``job_ref`` names (an id, or the newest job of that name); ``JobNotFound`` (exit 2) else."""
    return ws.store.get_job(job_ref).job_id


def top(ws: Workspace, job_ref: str, now: float | None = None) -> dict:
    """``top JOB``: the rank view the job's running supervisor writes each round (``<job dir>/ranks.json``), as
    ``{"job_id", "state", "attempt", "supervised", "doc", "stale"}``; never a connection of its own. A job that is
    not running, or that nobody supervises, is an error naming what to run instead (exit 1)."""
    from clusterctl.store import paths
    from clusterctl.supervise import jobdir
    from clusterctl.views import top as top_view

    now = time.time() if now is None else now
    job = ws.store.get_job(job_ref)
    if job.terminal:
        raise ClusterctlError(f"job {job.job_id} is {job.state.value}: no rank runs (`clusterctl status "
                              f"{job.name}` says how it ended)")
    if not controller.supervision(ws.root, job, now)["supervised"]:
        raise ClusterctlError(f"job {job.job_id} has no live supervisor: `top` shows what it sees of the ranks "
                              f"(`clusterctl status {job.name}`; `clusterctl resume {job.name}` supervises it again)")
    doc = jobdir.read_ranks(paths.job_dir(ws.root, job.job_id))
    if doc is not None and doc.get("attempt") != job.attempt:
        doc = None                        # an earlier attempt's view
    return {"job_id": job.job_id, "state": job.state.value, "attempt": job.attempt, "supervised": True,
            "doc": doc or {"ranks": [], "stragglers": []}, "stale": top_view.stale(doc, now)}


def watch_top(ws: Workspace, job_ref: str, on_view: Callable[[dict], None], *, interval_s: float = 2.0,
              sleep: Callable[[float], None] = time.sleep) -> dict:
    """``top JOB`` refreshing: ``on_view(view)`` every ``interval_s`` until the job ends (its end: ``top``'s
    error, raised)."""
    job_id = job_id_of(ws, job_ref)
    while True:
        on_view(top(ws, job_id))
        sleep(interval_s)
