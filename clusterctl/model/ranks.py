"""What every rank is doing, as values, and what that means (pure): ``RankView`` (one rank's monitor file, as the
node side writes it: docs/design.md "The rank view"), ``judge`` (per rank one of starting, training, waiting,
stuck, busy, gone: a hang named by its rank), ``slowdowns`` and ``Stragglers`` (a rank every collective waits
for), and ``Rates`` (step time and CPU % between two looks).

The node side (``clusterctl.rankview``, a thread in each rank) writes ``rank-<RANK>`` once a second; the watch
brings it to the controller with its line (``watch.Watch.ranks``); the supervisor judges each round and writes
``ranks.json`` in the job dir for ``clusterctl top``. No I/O here: tests drive it with scripted views.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Iterable, Mapping

STATES = ("starting", "training", "waiting", "stuck", "busy", "gone")

NOT_ANSWERING_S = 3.0    # a rank whose file stopped changing this long does not answer (stopped, or holds the GIL)
PEER_WAIT_S = 1.0        # a peer waiting this long in a collective: a still rank holds it up
MISMATCH_S = 3.0         # ranks waiting this long in different collectives: a mismatch, not a passing moment
STOPPED = ("T", "t")     # /proc/PID/stat states of a stopped (SIGSTOP) or traced process
DEAD = ("Z", "X", "x")   # a zombie or dead process
COMPUTING_PCT = 50.0     # CPU % since the last look of a rank that computes (``Rates.cpu_pct``)
# where a rank waits for its own DataLoader workers (they compute in other processes: its own CPU does not move)
DATA_WAIT = ("torch/utils/data/", "multiprocessing/queues.py", "multiprocessing/connection.py")


@dataclass(frozen=True)
class Collective:
    """A collective a rank waits in: its process group, sequence number, op ("all_reduce") and for how long."""

    pg: str
    seq: int
    op: str
    for_s: float = 0.0

    @property
    def key(self) -> tuple[str, int, str]:
        return (self.pg, self.seq, self.op)

    def __str__(self) -> str:
        return f"{self.op} #{self.seq}" + (f" (pg {self.pg})" if self.pg not in ("0", "") else "")

    @classmethod
    def from_json(cls, d: Any) -> "Collective | None":
        if not isinstance(d, Mapping):
            return None
        try:
            return cls(str(d.get("pg", "0")), int(d["seq"]), str(d.get("op") or "?"), _num(d.get("for_s")) or 0.0)
        except (KeyError, TypeError, ValueError):
            return None


@dataclass(frozen=True)
class RankView:
    """One rank's monitor file (``rank-<RANK>``, one line of JSON) plus what the controller adds: ``node`` and
    ``answered_age_s`` (seconds since its write counter ``n`` last changed, on the controller's clock)."""

    rank: int
    node: str = ""
    n: int = 0
    local_rank: int | None = None
    pid: int | None = None
    step: int | None = None            # optimizer steps (None: the script has no optimizer)
    step_age_s: float | None = None    # s since the step counter last changed (or since start)
    colls: int | None = None           # collectives of pg 0 completed
    coll_age_s: float | None = None
    in_coll: Collective | None = None  # the collective it waits in (the file's "in")
    cpu_s: float | None = None
    io: int | None = None
    rss: int | None = None
    where: str = ""                    # "<file>:<line> <function>" of the main thread
    stack: str = ""
    hint: str = "starting"             # the node side's own word: starting|training|waiting|busy|still
    arrivals: tuple[tuple[int, int], ...] = ()     # (seq, time_created_ns) of pg 0's last collectives
    peers: tuple[tuple[int, str], ...] = ()        # (pid, /proc state letter) of the node's other ranks
    gpu_util: float | None = None      # % (where nvidia-smi exists)
    gpu_mem: int | None = None         # bytes
    os_state: str | None = None        # its /proc state letter as its node's watch read it from outside (R, S, T...)
    os_cpu_s: float | None = None      # its CPU seconds, read so (they advance while its own thread cannot write)
    answered_age_s: float = 0.0

    @classmethod
    def from_json(cls, d: Mapping[str, Any], *, node: str = "", answered_age_s: float = 0.0) -> "RankView":
        """The node side's JSON (docs/design.md); unknown keys are ignored, a missing or malformed one is None.
        Raises ValueError without a usable ``rank``."""
        if not isinstance(d, Mapping):
            raise ValueError("a rank view is a JSON object")
        try:
            rank = int(d["rank"])
        except (KeyError, TypeError, ValueError):
            raise ValueError(f"a rank view without a rank: {str(d)[:80]}") from None
        arrivals = []
        for a in d.get("arrivals") or ():
            try:
                arrivals.append((int(a[0]), int(a[1])))
            except (TypeError, ValueError, IndexError):
                continue
        peers = []
        for pid, state in (d.get("peers") or {}).items() if isinstance(d.get("peers"), Mapping) else ():
            try:
                peers.append((int(pid), str(state)[:1]))
            except ValueError:
                continue
        hint = d.get("state")
        os_state, os_cpu_s = _os(d.get("os"), _num(d.get("hz")) or 100.0)
        return cls(rank=rank, node=node, n=_int(d.get("n")) or 0, local_rank=_int(d.get("local_rank")),
                   pid=_int(d.get("pid")), step=_int(d.get("step")), step_age_s=_num(d.get("step_age_s")),
                   colls=_int(d.get("colls")), coll_age_s=_num(d.get("coll_age_s")),
                   in_coll=Collective.from_json(d.get("in")), cpu_s=_num(d.get("cpu_s")), io=_int(d.get("io")),
                   rss=_int(d.get("rss")), where=str(d.get("where") or ""), stack=str(d.get("stack") or ""),
                   hint=hint if hint in ("starting", "training", "waiting", "busy", "still") else "starting",
                   arrivals=tuple(arrivals), peers=tuple(peers), gpu_util=_num(d.get("gpu_util")),
                   gpu_mem=_int(d.get("gpu_mem")), os_state=os_state, os_cpu_s=os_cpu_s,
                   answered_age_s=float(answered_age_s))

    @property
    def progress_age_s(self) -> float | None:
        """Seconds since its last progress (a step, else a completed collective), as of now: the file's ages plus
        the time since the file last changed (a rank that does not answer ages too)."""
        ages = [a for a in (self.step_age_s, self.coll_age_s) if a is not None]
        return min(ages) + self.answered_age_s if ages else None

    @property
    def answering(self) -> bool:
        return self.answered_age_s < NOT_ANSWERING_S


@dataclass(frozen=True)
class RankState:
    """What ``judge`` says of one rank. For ``stuck``: ``peers_in`` is the collective its peers wait in (None: it
    waits in another collective than theirs, ``mismatch``) and ``peers_for_s`` for how long."""

    node: str
    rank: int
    state: str
    where: str = ""
    why: str = ""
    step: int | None = None
    progress_age_s: float | None = None
    waiting_s: float | None = None          # how long it waits in its collective now
    in_coll: Collective | None = None
    peers_in: Collective | None = None
    peers_for_s: float | None = None
    mismatch: bool = False
    data_wait: bool = False                 # it waits for its DataLoader workers (the data pipeline)
    rss: int | None = None
    gpu_util: float | None = None
    gpu_mem: int | None = None

    def message(self) -> str:
        """One line naming it: "node n2 rank 1 stuck in train.py:40 sleep for 21s while its peers wait in
        all_reduce #12 for 20s"."""
        head = f"node {self.node} rank {self.rank}"
        if self.state != "stuck":
            return f"{head} {self.state}" + (f": {self.why}" if self.why else "")
        if self.mismatch:
            return (f"{head} stuck in {self.in_coll} for {self.waiting_s or 0:.0f}s while its peers wait in "
                    f"{self.peers_in} for {self.peers_for_s or 0:.0f}s (mismatched collectives)")
        age = f" for {self.progress_age_s:.0f}s" if self.progress_age_s is not None else ""
        return (f"{head} stuck in {self.where or 'its own code'}{age} ({self.why}) while its peers wait in "
                f"{self.peers_in} for {self.peers_for_s or 0:.0f}s")


Views = Mapping[str, Mapping[int, RankView]]     # node -> rank -> view


def judge(views: Views, *, gone_nodes: Iterable[str] = (), world: int | None = None,
          computing: Iterable[tuple[str, int]] = ()) -> list[RankState]:
    """Per rank (sorted by rank) one of ``STATES``.

    - gone: its node's process is gone (``gone_nodes``), another rank on its node sees its pid dead, or (with
      ``world``) no file for it at all.
    - stuck: (a) still (no progress, no CPU, no I/O, the same stack), stopped (/proc state T as its node's other
      ranks see it) or not answering for ``NOT_ANSWERING_S``, outside a collective, while a peer waits in one; or
      (b) waiting in another collective than the one most ranks wait in (another op, or another sequence number).
      Another sequence number of the same op and group is not a mismatch while a rank is ``computing`` (its CPU
      busy since the last look: ``Rates``): DDP enqueues a step's buckets as the backward pass goes, so a slow
      rank's newest collective trails its peers' while it computes (and theirs leads it, however many they are).
    - busy: no progress but CPU or I/O advancing (never stuck), or waiting for its own DataLoader's workers.
    - waiting, training, starting: as the node side says (a still rank nobody waits for: waiting).
    """
    gone_nodes, computing = set(gone_nodes), set(computing)
    flat = [v for node_views in views.values() for v in node_views.values()]
    proc = {}           # pid -> state letter, as the node's other ranks see it (per node: pids are per host)
    for v in flat:
        for pid, letter in v.peers:
            proc[(v.node, pid)] = letter
    waiting = [v for v in flat if v.in_coll is not None and v.answering and v.node not in gone_nodes]
    long_wait = [v for v in waiting if v.in_coll.for_s >= PEER_WAIT_S]
    long_ids = {id(v) for v in long_wait}
    common = _common_collective(long_wait)
    out = []
    for v in flat:
        # its /proc state as its node's watch read it (any rank; else as its node's other ranks see it)
        letter = v.os_state or (proc.get((v.node, v.pid)) if v.pid is not None else None)
        peer_wait = len(long_wait) > (id(v) in long_ids)          # a peer (not itself) waits in a collective
        base = dict(node=v.node, rank=v.rank, where=v.where, step=v.step, progress_age_s=v.progress_age_s,
                    waiting_s=v.in_coll.for_s if v.in_coll else None, in_coll=v.in_coll, rss=v.rss,
                    gpu_util=v.gpu_util, gpu_mem=v.gpu_mem)
        if v.node in gone_nodes or letter in DEAD:
            out.append(RankState(state="gone", why="its process is gone", **base))
            continue
        stopped = letter in STOPPED
        if not v.answering and (letter == "R" or (v.node, v.rank) in computing):
            # running or its CPU time advancing, its monitor starved: a long call holding the GIL computes
            out.append(RankState(state="busy", why="computing, not answering (a long call holding the GIL?)",
                                 **base))
            continue
        silent = stopped or not v.answering
        data_wait = any(p in v.where for p in DATA_WAIT)
        trailing = (v.in_coll is not None and common is not None and v.in_coll.pg == common.pg
                    and v.in_coll.op == common.op and bool(computing))
        if (v.in_coll is not None and not silent and common is not None and v.in_coll.key != common.key
                and v.in_coll.for_s >= MISMATCH_S and common.for_s >= MISMATCH_S and not trailing):
            out.append(RankState(state="stuck", why="mismatched collective", peers_in=common,
                                 peers_for_s=common.for_s, mismatch=True, **base))
            continue
        if peer_wait and (silent or (v.hint == "still" and v.in_coll is None and not data_wait)):
            peers_in = common if id(v) not in long_ids else _common_collective([w for w in long_wait if w is not v])
            why = ("stopped (SIGSTOP)" if stopped else
                   f"not answering for {v.answered_age_s:.0f}s" if silent else "no CPU, no I/O, the same stack")
            out.append(RankState(state="stuck", why=why, peers_in=peers_in, peers_for_s=max(
                w.in_coll.for_s for w in long_wait if w is not v and w.in_coll.key == peers_in.key), **base))
            continue
        if data_wait and v.hint in ("still", "busy"):
            out.append(RankState(state="busy", why="waiting for its DataLoader workers (data pipeline)",
                                 data_wait=True, **base))
            continue
        state = {"still": "waiting"}.get(v.hint, v.hint)
        why = {"busy": "no progress, CPU or I/O advancing", "waiting": f"in {v.in_coll}" if v.in_coll else ""}
        out.append(RankState(state=state, why=why.get(state, ""), **base))
    if world is not None:
        seen = {v.rank for v in flat}
        out += [RankState(node="", rank=r, state="gone", why="no view of it") for r in range(world) if r not in seen]
    return sorted(out, key=lambda s: (s.rank, s.node))


def _common_collective(waiting: list[RankView]) -> Collective | None:
    """The collective most of ``waiting`` wait in (ties: the lowest sequence number), with the longest wait."""
    if not waiting:
        return None
    counts: dict[tuple, list[float]] = {}
    for v in waiting:
        counts.setdefault(v.in_coll.key, []).append(v.in_coll.for_s)
    key = max(counts, key=lambda k: (len(counts[k]), -k[1]))
    return Collective(key[0], key[1], key[2], max(counts[key]))


def stuck_culprit(states: list[RankState], *, stuck_timeout_s: float) -> RankState | None:
    """The stuck rank that makes the attempt a hang: stuck, and its last progress at least ``stuck_timeout_s``
    ago (a mismatched rank: waiting that long). The longest without progress first."""
    if stuck_timeout_s <= 0:
        return None
    ripe = [s for s in states if s.state == "stuck"
            and ((s.waiting_s or 0) if s.mismatch and s.progress_age_s is None else (s.progress_age_s or 0))
            >= stuck_timeout_s]
    return max(ripe, key=lambda s: (s.progress_age_s or 0, -s.rank)) if ripe else None


# ------------------------------------------------------------------------------------------------ stragglers

MIN_COLLECTIVES = 20    # arrivals needed to judge a rank's lateness
NAME_AT = 1.5           # slowdown at which a rank is a straggler (sustained SUSTAIN_S)
CLEAR_AT = 1.2          # ... and below which it has recovered (sustained SUSTAIN_S)
SUSTAIN_S = 60.0


WINDOW = 64            # the newest collectives every rank has that a slowdown is computed over
KEEP = 256             # arrivals kept per rank between looks (each rank's file carries only its last 32)


def slowdowns(views: Views, log: "ArrivalLog | None" = None) -> dict[tuple[str, int], float]:
    """Per rank how much slower than the fastest it arrives at pg 0's collectives: ``P / (P - lateness)``, with
    lateness its mean delay after the earliest rank over the newest ``WINDOW`` collectives every rank has (at
    least ``MIN_COLLECTIVES``) and P the mean period between them. ``log``: the arrivals of earlier looks too
    (each rank refreshes its list on its own clock: two ranks' last 32 may not overlap). {} when there is not
    enough to tell."""
    per = {(v.node, v.rank): dict(v.arrivals) for nv in views.values() for v in nv.values() if v.arrivals}
    if log is not None:
        per = log.merge(per)
    if len(per) < 2:
        return {}
    seqs = sorted(set.intersection(*(set(p) for p in per.values())))[-WINDOW:]
    if len(seqs) < MIN_COLLECTIVES:
        return {}
    earliest = [min(p[s] for p in per.values()) for s in seqs]
    steps = [b - a for a, b, sa, sb in zip(earliest, earliest[1:], seqs, seqs[1:]) if sb == sa + 1]
    period = sum(steps) / len(steps) if steps else 0      # mean: a step's collectives come at uneven intervals
    if period <= 0:
        return {}
    out = {}
    mean_earliest = sum(earliest) / len(earliest)
    for key, p in per.items():
        lateness = sum(p[s] for s in seqs) / len(seqs) - mean_earliest
        out[key] = period / (period - lateness) if lateness < period else float("inf")
    return out


@dataclass
class ArrivalLog:
    """Each rank's arrivals (seq -> time_created_ns) gathered over successive looks, the newest ``KEEP``."""

    arrivals: dict[tuple[str, int], dict[int, int]] = field(default_factory=dict)

    def merge(self, fresh: Mapping[tuple[str, int], Mapping[int, int]]) -> dict[tuple[str, int], dict[int, int]]:
        for key, got in fresh.items():
            mine = self.arrivals.setdefault(key, {})
            if got and mine and min(got) < min(mine) - KEEP:     # the counter went back: a new process group
                mine.clear()
            mine.update(got)
            if len(mine) > KEEP:
                for seq in sorted(mine)[:-KEEP]:
                    del mine[seq]
        for key in set(self.arrivals) - set(fresh):
            del self.arrivals[key]
        return self.arrivals


@dataclass(frozen=True)
class Straggler:
    node: str
    rank: int
    slowdown: float

    def as_json(self) -> dict:
        return {"node": self.node, "rank": self.rank, "slowdown": round(self.slowdown, 2)}


@dataclass
class Stragglers:
    """Which ranks are stragglers: named once ``slowdown >= NAME_AT`` for ``SUSTAIN_S``, cleared once it stays
    below ``CLEAR_AT`` for ``SUSTAIN_S``. ``update`` returns (named now, recovered now).

    Only time in which collectives complete counts (``moving``): while none does (every rank waits for one that
    computes silently, writes a checkpoint, or hangs) the window of arrivals stands still with that one late
    arrival in it, which is a pause, not a rank that makes every step wait (the soak named every rank of a job
    with a 200 s silent phase a straggler before)."""

    sustain_s: float = SUSTAIN_S
    current: dict[tuple[str, int], Straggler] = field(default_factory=dict)
    _slow_since: dict[tuple[str, int], float] = field(default_factory=dict)
    _fast_since: dict[tuple[str, int], float] = field(default_factory=dict)
    _last: float | None = None

    def update(self, slow: Mapping[tuple[str, int], float], now: float, *,
               moving: bool = True) -> tuple[list[Straggler], list[Straggler]]:
        if not moving and self._last is not None:      # the pause since the last look does not count
            for since in (self._slow_since, self._fast_since):
                for key in since:
                    since[key] += now - self._last
        self._last = now
        if not moving:
            return [], []
        named, recovered = [], []
        for key, s in slow.items():
            if s >= NAME_AT:
                self._fast_since.pop(key, None)
                since = self._slow_since.setdefault(key, now)
                if key in self.current:
                    self.current[key] = replace(self.current[key], slowdown=s)
                elif now - since >= self.sustain_s:
                    self.current[key] = Straggler(key[0], key[1], s)
                    named.append(self.current[key])
            else:
                self._slow_since.pop(key, None)
                if key in self.current and s < CLEAR_AT:
                    since = self._fast_since.setdefault(key, now)
                    if now - since >= self.sustain_s:
                        recovered.append(replace(self.current.pop(key), slowdown=s))   # as it is now
                        self._fast_since.pop(key)
                else:
                    self._fast_since.pop(key, None)
        return named, recovered

    def listed(self) -> list[Straggler]:
        return sorted(self.current.values(), key=lambda s: (s.rank, s.node))


# ------------------------------------------------------------------------------------------ rates for `top`

@dataclass
class Rates:
    """Step time (s per optimizer step, between two changes of the counter) and CPU % (between two looks) per
    rank, from successive views on the controller's clock."""

    step_time: dict[tuple[str, int], float] = field(default_factory=dict)
    cpu_pct: dict[tuple[str, int], float] = field(default_factory=dict)
    _step_at: dict[tuple[str, int], tuple[float, int]] = field(default_factory=dict)
    _cpu_at: dict[tuple[str, int], tuple[float, float]] = field(default_factory=dict)
    _os_at: dict[tuple[str, int], tuple[float, float]] = field(default_factory=dict)

    def update(self, views: Views, now: float) -> None:
        seen = set()
        for node_views in views.values():
            for v in node_views.values():
                key = (v.node, v.rank)
                seen.add(key)
                if v.step is not None:
                    last = self._step_at.get(key)
                    if last is None or v.step < last[1]:
                        self._step_at[key] = (now, v.step)
                    elif v.step > last[1]:
                        if now > last[0]:
                            self.step_time[key] = (now - last[0]) / (v.step - last[1])
                        self._step_at[key] = (now, v.step)
                last_os = self._os_at.get(key)
                if v.os_cpu_s is not None:
                    self._os_at[key] = (now, v.os_cpu_s)
                if v.cpu_s is not None and v.answering:
                    last_cpu = self._cpu_at.get(key)
                    if last_cpu is not None and now > last_cpu[0]:
                        self.cpu_pct[key] = max(0.0, (v.cpu_s - last_cpu[1]) / (now - last_cpu[0]) * 100)
                    self._cpu_at[key] = (now, v.cpu_s)
                elif not v.answering:      # its own file stands still: its CPU as the node reads it from outside
                    ok = v.os_cpu_s is not None and last_os is not None and now > last_os[0]
                    self.cpu_pct[key] = max(0.0, (v.os_cpu_s - last_os[1]) / (now - last_os[0]) * 100) if ok else 0.0
        for d in (self.step_time, self.cpu_pct, self._step_at, self._cpu_at, self._os_at):
            for key in set(d) - seen:
                d.pop(key)


def _os(x: Any, hz: float) -> tuple[str | None, float | None]:
    """The watch's ``"os": "STATE CPU_TICKS"`` (``runtimes.RANK_OS``) as (state letter, CPU seconds)."""
    parts = x.split() if isinstance(x, str) else []
    if len(parts) != 2 or len(parts[0]) != 1 or not parts[1].isdigit() or hz <= 0:
        return None, None
    return parts[0], int(parts[1]) / hz


def _int(x: Any) -> int | None:
    if isinstance(x, bool) or x is None:
        return None
    try:
        return int(x)
    except (TypeError, ValueError):
        return None


def _num(x: Any) -> float | None:
    if isinstance(x, bool) or x is None:
        return None
    try:
        f = float(x)
    except (TypeError, ValueError):
        return None
    return f if f == f and f not in (float("inf"), float("-inf")) else None
