"""Goodput benchmark: `clusterctl report` against the training script's own ground truth, over a run with a fault
every few minutes.

    python bench/goodput.py [--minutes 30] [--fault-every 300]
                            [--faults kill_node,partition,kill_rdzv_host,hang,user_error] [--step-time 0.2]
                            [--checkpoint-every 50] [--hang-timeout 60] [--save DIR] [--no-write]
                            [--prefix bgp --subnet 241]

On a 3-host testbed (network namespaces, sshd, podman; ``profile(gpus=0)``) one job runs for ``--minutes``:
``bench/goodput_train.py`` (a small DDP model, 2 ranks per node, ``nodes: "2:3"``, ``recovery: warm`` = the
default, a checkpoint every ``--checkpoint-every`` steps, ``step N`` printed every step: the supervisor's step
signal). Every ``--fault-every`` seconds after the launch the next fault of ``--faults`` (cycled) hits the attempt
that runs then:

- ``kill_node``: SIGKILL of everything of the job on a node that is not the rendezvous host (its containers, the
  zygote's too: that node restarts cold);
- ``partition``: that node's link down, healed once the supervisor's verdict is out;
- ``kill_rdzv_host``: the same kill on the rendezvous host;
- ``hang``: the job's last rank sleeps forever before its next step (a control file on the shared storage), its
  peers wait in the all-reduce, nothing prints: found by "no progress for ``supervisor.hang_timeout_s``", which
  the bench's job sets to ``--hang-timeout`` (60 s; the default is 300: not 30, which made a first start on 2
  loaded cores a hang, 30 s without a line between torch's warnings and the first step), or sooner by the
  stuck-rank verdict (``supervisor.stuck_timeout_s``, 20 s by default) where the clusterctl run has one;
- ``user_error``: the last rank raises (exit 1). A user error does not end the job here: the supervisor relaunches
  it from the newest checkpoint, charged to ``restarts.max_failures`` (the bench's job sets both budgets to 100,
  and ``restarts.max_restarts: 0`` so torchrun does not restart it in place), the relaunch path the other faults
  take; no ``clusterctl resume``.

At the end the bench writes a ``finish`` control file: every rank stops after the same step, saves, exits 0, and
the job SUCCEEDS. Ground truth (rank 0, on the shared storage): every step's start and end wall time and
attempt, and the checkpoint step each attempt resumed from; a step is kept when the next attempt resumed from a
checkpoint that holds it (every step of the last attempt is kept: it saved at the end). Then
``clusterctl report JOB --output json`` is compared with it: ``productive_s`` (within 1 percentage point of the
wall time), and per disruption ``lost_steps`` (within 1 step) and ``lost_s`` (within 1 s). Results replace the
``## goodput`` section of docs/benchmarks.md, and ``clusterctl report --plot`` draws the run into
docs/goodput-bench.png. Not a timed test: one run, its figures.

Every supervisor the bench started is stopped before the testbed goes down, also on Ctrl-C, SIGTERM and errors.
"""
from __future__ import annotations

import datetime
import json
import os
import platform
import shutil
import signal
import sys
import time
from pathlib import Path

import common  # noqa: E402  (puts the repository root on sys.path)
from common import DOC, ROOT, exit_on_signals  # noqa: E402

from clusterctl.store import paths  # noqa: E402
from tests.integration import fault_series as fs  # noqa: E402
from tests.integration import recovery_harness as rh  # noqa: E402
from tests.testbed import Testbed, profile  # noqa: E402

SECTION = "## goodput"
TRAIN = ROOT / "bench" / "goodput_train.py"
PLOT = ROOT / "docs" / "goodput-bench.png"
FAULTS = ("kill_node", "partition", "kill_rdzv_host", "hang", "user_error")
NAME = "goodputbench"


def jsonl(path: Path) -> list[dict]:
    out = []
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                pass        # a line cut by a SIGKILL mid-write
    return out


def touch(path: Path) -> None:
    """A control file, in place at once (the taker renames it)."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(f"{time.time()}\n")
    tmp.replace(path)


class Job:
    """The bench's job on the testbed: launch, faults, the end."""

    def __init__(self, tb, base: Path, args):
        self.tb, self.args = tb, args
        shared = Path(tb.shared) / NAME
        self.control = shared / "control"
        self.resumes = shared / "resumes.jsonl"
        self.control.mkdir(parents=True, exist_ok=True)
        self.run = rh.new_run(
            tb, base / "job", NAME, script=TRAIN, steps=10**9, every=args.checkpoint_every,
            step_time=args.step_time, nodes="2:3", nproc=2,
            extra_args=["--resumes", str(self.resumes), "--control", str(self.control), "--log-every", "1"],
            supervisor={"hang_timeout_s": args.hang_timeout},
            restarts={"max_failures": 100, "max_node_failures": 100})
        self.partitioned: set[str] = set()
        self.hit: list[str] = []          # victims so far: a node fault picks the node hit least

    def attempt_now(self) -> int:
        with self.run.store() as store:
            return store.attempts(store.get_job(NAME).job_id)[-1].attempt

    def wait_training(self, after: int, timeout: float = 240) -> dict:
        """Until an attempt later than ``after`` records a step; that step."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            rec = next((r for r in reversed(self.run.steps_log()) if int(r["attempt"]) > after), None)
            if rec is not None:
                return rec
            job = self.run.job_row()
            if job is not None and job.terminal:
                raise RuntimeError(f"job ended ({job.state.value}: {job.reason})\n" + self.run.events_text())
            time.sleep(0.5)
        raise RuntimeError(f"no training after attempt {after} for {timeout:g} s\n" + self.run.events_text())

    def node(self, rdzv: bool) -> str:
        att = self.run.current_attempt()
        if rdzv:
            return att.rdzv_host
        others = [n for n in att.nodes if n != att.rdzv_host]
        return min(others, key=lambda n: (self.hit.count(n), -others.index(n)))

    def inject(self, kind: str) -> dict:
        attempt = self.attempt_now()
        victim = None
        if kind in ("kill_node", "kill_rdzv_host", "partition"):
            victim = self.node(kind == "kill_rdzv_host")
            self.hit.append(victim)
        if kind == "partition":
            self.tb.partition(victim)
            self.partitioned.add(victim)
        elif kind in ("kill_node", "kill_rdzv_host"):
            if not self.tb.kill(victim, pattern=rh.JOB_PATTERN):
                raise RuntimeError(f"nothing of the job to kill on {victim}")
        elif kind == "hang":
            touch(self.control / "hang")
        elif kind == "user_error":
            touch(self.control / "fail")
        else:
            raise ValueError(f"unknown fault {kind}")
        at = time.time()
        if victim in self.partitioned:        # healed once the supervisor gave the node up
            end = time.monotonic() + 120
            while time.monotonic() < end and not any(e["kind"] == "verdict" and e["time"] >= at
                                                     for e in fs.events(self.run)):
                time.sleep(0.5)
            self.heal()
        first = self.wait_training(attempt)
        return {"fault": kind, "victim": victim, "at": at, "attempt": attempt, "recovered": first["time"]}

    def heal(self) -> None:
        for v in list(self.partitioned):
            self.tb.heal(v)
            self.partitioned.discard(v)

    def finish(self) -> dict:
        touch(self.control / "finish")
        return self.run.wait_end(300)

    def stop(self) -> None:
        """No supervisor of the bench outlives the testbed: `clusterctl stop` unless the job ended, then the
        supervisor's pid (the one the job recorded) is waited for, and killed if it still lives."""
        self.heal()
        try:
            rh.stop_unless_done(self.run)
        except Exception as e:  # noqa: BLE001 - the kill below still runs
            print(f"clusterctl stop failed: {e}", file=sys.stderr)
        job = self.run.job_row()
        pid = int(job.supervisor_pid) if job is not None and job.supervisor_pid else None
        end = time.monotonic() + 30
        while pid and rh._alive(pid) and time.monotonic() < end:
            time.sleep(0.5)
        if pid and rh._alive(pid):
            print(f"killing supervisor pid {pid}", file=sys.stderr)
            os.kill(pid, signal.SIGKILL)


def truth(steps: list[dict], resumes: list[dict]) -> dict:
    """From the script's records: productive seconds (kept steps' start -> end) and, per attempt that a later
    attempt resumed after, the steps it trained that were not kept and their seconds."""
    resumed = {int(r["attempt"]): int(r["resumed_from"]) for r in resumes}
    by: dict[int, list[dict]] = {}
    for s in steps:
        by.setdefault(int(s["attempt"]), []).append(s)
    productive, between, lost = 0.0, 0.0, {}
    for a in sorted(set(by) | set(resumed)):
        ss = by.get(a, [])
        nxt = min((b for b in resumed if b > a), default=None)
        keep_to = resumed[nxt] if nxt is not None else None
        gone = [s for s in ss if keep_to is not None and s["step"] > keep_to]
        productive += sum(s["time"] - s["start"] for s in ss if s not in gone)
        # between two kept steps (a checkpoint save, the record, the line): not a step's time by the truth's
        # definition; the report has no signal for it and counts it with the steps
        between += sum(q["start"] - p["time"] for p, q in zip(ss, ss[1:]) if q not in gone)
        if nxt is not None:
            lost[a] = {"steps": len(gone), "s": sum(s["time"] - s["start"] for s in gone),
                       "last_end": max((s["time"] for s in ss), default=None), "next_first": min(
                           (s["time"] for s in by.get(nxt, [])), default=None)}
    return {"productive_s": productive, "between_s": between, "lost": lost, "steps": len(steps), "trained": set(by),
            "kept": len(steps) - sum(v["steps"] for v in lost.values())}


def compare(report: dict, faults: list[dict], tr: dict) -> dict:
    wall = report["wall_s"]
    rows = []
    by_attempt = {f["attempt"]: f for f in faults}
    for d in report["disruptions"]:
        f = by_attempt.get(d["attempt"], {})
        t = tr["lost"].get(d["attempt"]) or ({"steps": 0, "s": 0.0} if d["attempt"] not in tr["trained"] else
                                             {"steps": None, "s": None})     # it trained nothing: lost nothing
        ok_steps = t["steps"] is not None and d["lost_steps"] is not None and abs(d["lost_steps"] - t["steps"]) <= 1
        ok_s = t["s"] is not None and d["lost_s"] is not None and abs(d["lost_s"] - t["s"]) <= 1.0
        at = f.get("at")
        rows.append({"attempt": d["attempt"], "fault": f.get("fault", "(none injected)"),
                     "victim": f.get("victim") or d.get("node") or "-", "verdict": d["verdict"],
                     "recovery": d["recovery"], "cordoned": d["cordoned"],
                     "detect": d["detected_at"] - at if at and d["detected_at"] else None,
                     "first_step": d["first_step_at"] - at if at and d["first_step_at"] else None,
                     "lost_steps": d["lost_steps"], "true_steps": t["steps"],
                     "lost_s": d["lost_s"], "true_s": t["s"], "ok": ok_steps and ok_s})
    missing = [f for f in faults if f["attempt"] not in {d["attempt"] for d in report["disruptions"]}]
    pp = 100 * abs(report["productive_s"] - tr["productive_s"]) / wall
    return {"rows": rows, "missing": missing, "pp": pp, "ok_productive": pp <= 1.0,
            "ok": pp <= 1.0 and not missing and all(r["ok"] for r in rows)}


def sec(v, nd: int = 1) -> str:
    return "-" if v is None else f"{v:.{nd}f}"


def section(report: dict, tr: dict, cmp: dict, args, start_load: float, end_load: float | None = None,
            recomputed: bool = False) -> str:
    when = datetime.datetime.fromtimestamp(report["ended_at"] or time.time(), datetime.timezone.utc)
    now = datetime.datetime.now(datetime.timezone.utc)
    when = (f"Run ended {when:%Y-%m-%d %H:%M} UTC; its report recomputed {now:%H:%M} UTC from the files it kept "
            "(`--save`, then `--from`: model.goodput as of then). Measured"
            if recomputed else f"Measured {when:%Y-%m-%d %H:%M} UTC")
    wall = report["wall_s"]
    lines = [SECTION, "",
             f"{when} on {os.cpu_count()} cores ({common.cpu_model() or platform.machine()}), Python "
             f"{platform.python_version()}, load average {start_load:.1f} at the start and "
             f"{end_load if end_load is not None else os.getloadavg()[0]:.1f} at the end (other work shared the "
             f"cores). One job for {args.minutes:g} minutes on a 3-host testbed (podman, `profile(gpus=0)`): "
             "`bench/goodput_train.py`, `nodes: \"2:3\"`, "
             f"2 ranks per node, `recovery: warm` (the default), `--step-time {args.step_time:g} --checkpoint-every "
             f"{args.checkpoint_every}`, a `step N` line every step, `supervisor.hang_timeout_s: "
             f"{args.hang_timeout:g}`; a fault every {args.fault_every:g} s ({', '.join(args.faults.split(','))}, "
             "in turn; the user error is relaunched by the supervisor, `restarts.max_failures`); then every rank "
             f"stops at one step and the job succeeds. Rerun: `python bench/goodput.py --minutes {args.minutes:g} "
             f"--fault-every {args.fault_every:g}` (as root; own testbed, prefix `{args.prefix}`, "
             f"10.{args.subnet}.0.0/24). The script's ground truth: every step's start and end (rank 0), and the "
             "checkpoint each attempt resumed from (a step is kept when the next attempt resumed from a "
             "checkpoint holding it).", "",
             "`clusterctl report` against the truth, per disruption (times in s after the injection; lost: "
             "report / truth):", "",
             "| attempt | fault | victim | verdict | recovery | detected s | first step s | lost steps | lost s | "
             "within bounds |", "|---:|---|---|---|---|---:|---:|---:|---:|---|"]
    for r in cmp["rows"]:
        lines.append(f"| {r['attempt']} | {r['fault']} | {r['victim']} | {r['verdict']} | {r['recovery'] or '-'} "
                     f"| {sec(r['detect'])} | {sec(r['first_step'])} | {r['lost_steps']} / {r['true_steps']} | "
                     f"{sec(r['lost_s'], 2)} / {sec(r['true_s'], 2)} | {'yes' if r['ok'] else 'NO'} |")
    for f in cmp["missing"]:
        lines.append(f"| {f['attempt']} | {f['fault']} | {f['victim'] or '-'} | (no disruption in the report) "
                     "| - | - | - | - | - | NO |")
    badput = ", ".join(f"{k} {v:.1f}" for k, v in report["badput_s"].items() if v)
    lines += ["",
              f"Wall time {wall:.1f} s; productive {report['productive_s']:.1f} s by the report, "
              f"{tr['productive_s']:.1f} s by the truth ({100 * report['productive_s'] / wall:.2f} % vs "
              f"{100 * tr['productive_s'] / wall:.2f} % of the wall time: {cmp['pp']:.2f} percentage points apart, "
              f"bound 1; of the difference, {tr['between_s']:.1f} s is the time between two kept steps, mostly "
              "checkpoint saves: the truth counts a step from its start to its end, the report cannot tell a save "
              f"from a step and counts it as training). **Goodput {100 * report['goodput']:.1f} %, "
              f"ETTR {100 * report['ettr']:.1f} %** (the "
              f"report's; by the truth {100 * tr['productive_s'] / wall:.1f} %); {tr['steps']} steps trained, "
              f"{tr['kept']} kept. Badput (s): {badput}. Every figure within its bound: "
              f"{'yes' if cmp['ok'] else 'NO'}.", "",
              "![the run, drawn by `clusterctl report --plot`](goodput-bench.png)", ""]
    return "\n".join(lines)


def recompute(d: Path, args) -> int:
    """``--from DIR``: the section from a kept run (``--save DIR``), its report rebuilt from the job dir's files."""
    from clusterctl.model.goodput import build
    from clusterctl.supervise import jobdir

    kept = json.loads((d / "jobdir-goodput.json").read_text())
    report = build(jobdir.read_marks(d / "jobdir-events.jsonl"), jobdir.read_steps(d / "jobdir-steps.jsonl"),
                   created_at=kept.get("created_at"), now=time.time(), job_id=kept.get("job_id"),
                   name=kept.get("name"), state=kept.get("state"))
    tr = truth(jsonl(d / "truth-steps.jsonl"), jsonl(d / "truth-resumes.jsonl"))
    load = json.loads((d / "load.json").read_text()) if (d / "load.json").exists() else {"start": 0.0, "end": 0.0}
    text = section(report, tr, compare(report, json.loads((d / "faults.json").read_text()), tr), args,
                   load["start"], load["end"], recomputed=True)
    common.publish(SECTION, text, write=not args.no_write)
    return 0


def main(argv=None) -> int:
    ap = common.parser(__doc__.splitlines()[0], prefix="bgp", subnet=241)
    ap.add_argument("--minutes", type=float, default=30)
    ap.add_argument("--fault-every", type=float, default=300, metavar="S")
    ap.add_argument("--faults", default=",".join(FAULTS))
    ap.add_argument("--step-time", type=float, default=0.2)
    ap.add_argument("--checkpoint-every", type=int, default=50)
    ap.add_argument("--hang-timeout", type=float, default=60, help="the job's supervisor.hang_timeout_s")
    ap.add_argument("--save", default="", metavar="DIR",
                    help="keep the report, the truth files and the job's events in DIR")
    ap.add_argument("--from", dest="from_dir", default="", metavar="DIR",
                    help="no run: the report recomputed (model.goodput as it is now) from the files a run kept with "
                         "--save DIR, against its truth; pass that run's --minutes/--fault-every/... for the text")
    args = ap.parse_args(argv)
    if args.from_dir:
        return recompute(Path(args.from_dir), args)
    kinds = [k for k in args.faults.split(",") if k]
    if unknown := set(kinds) - set(FAULTS):
        ap.error(f"unknown faults {sorted(unknown)}; known: {', '.join(FAULTS)}")
    exit_on_signals()
    load = os.getloadavg()[0]
    base = common.scratch("clusterctl-bench-goodput-")    # removed at exit unless the bench failed
    tb = Testbed(3, base / "tb", [profile(gpus=0)] * 3, prefix=args.prefix, subnet_octet=args.subnet)
    job = None
    try:
        tb.up()
        job = Job(tb, base, args)
        job.run.launch()
        t0 = time.time()
        job.wait_training(0, timeout=600)
        total = args.minutes * 60
        faults = []
        trained = time.time()           # when the running attempt was seen training
        for i in range(1, int((total - 1) // args.fault_every) + 1):
            kind = kinds[(i - 1) % len(kinds)]
            # on time, but never before the attempt trained for a third of the interval (a slow recovery, or a
            # slow first start, shifts the faults after it instead of piling them up)
            wait = max(t0 + i * args.fault_every, trained + args.fault_every / 3) - time.time()
            if wait > 0:
                time.sleep(wait)
            f = job.inject(kind)
            print(f"{time.time() - t0:7.1f} s  fault {i}: {kind} on {f['victim'] or '-'} in attempt {f['attempt']}, "
                  f"training again after {f['recovered'] - f['at']:.1f} s", flush=True)
            faults.append(f)
            trained = f["recovered"]
        if (wait := t0 + total - time.time()) > 0:
            time.sleep(wait)
        st = job.finish()
        if st["state"] != "SUCCEEDED":
            raise RuntimeError(f"job {st['state']}: {st.get('reason')}\n" + job.run.events_text())
        report = json.loads(job.run.cli("report", NAME, "-o", "json", timeout=120).stdout)
        steps, resumes = job.run.steps_log(), jsonl(job.resumes)
        if args.save:
            out = Path(args.save)
            out.mkdir(parents=True, exist_ok=True)
            (out / "report.json").write_text(json.dumps(report, indent=1))
            (out / "load.json").write_text(json.dumps({"start": load, "end": os.getloadavg()[0]}))
            (out / "faults.json").write_text(json.dumps(faults, indent=1))
            (out / "events.json").write_text(json.dumps(job.run.events(), indent=1))
            shutil.copy(job.run.record, out / "truth-steps.jsonl")
            shutil.copy(job.resumes, out / "truth-resumes.jsonl")
            jdir = paths.job_dir(job.run.state_dir, job.run.job_row().job_id)
            for f in ("steps.jsonl", "goodput.json", "events.jsonl"):
                if (jdir / f).exists():
                    shutil.copy(jdir / f, out / f"jobdir-{f}")
        if not args.no_write:
            job.run.cli("report", NAME, "--plot", str(PLOT), timeout=180)
    finally:
        if job is not None:
            job.stop()
        tb.down()
    tr = truth(steps, resumes)
    cmp = compare(report, faults, tr)
    common.publish(SECTION, section(report, tr, cmp, args, load), write=not args.no_write)
    return 0


if __name__ == "__main__":
    sys.exit(main())
