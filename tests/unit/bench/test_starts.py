"""bench/starts.py: a start run as one child process (torchrun here, or `clusterctl launch` of the embedded default)
ends and finishes by one piece of code (``Child``; it was written out twice, the same each time)."""
from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parents[3] / "bench"


def _starts():
    sys.path.insert(0, str(BENCH))      # the benches import their `common` beside them
    try:
        import starts
    finally:
        sys.path.remove(str(BENCH))
    return starts


def test_a_start_that_is_a_child_process_finishes_by_one_piece_of_code():
    starts = _starts()
    assert starts.Torchrun.finish is starts.Local.finish is starts.Child.finish
    assert starts.Torchrun.ended is starts.Local.ended is starts.Child.ended
    start = starts.Child()
    start.proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert not start.ended() and start.finish(0.2) is None        # not within the bound: None, still running
    finally:
        start.proc.kill()
    assert start.finish(10) == -9 and start.ended()
    start.proc = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    assert start.finish(10) == 3


class _Fake:
    """A start whose fate is set: ``reach`` (every rank steps, then it ends), ``linger`` (steps late, never ends),
    ``fail`` (ends without a step), ``stuck`` (nothing, until it is killed)."""

    def __init__(self, tmp: Path, i: int, port: int, fate: str, flying: list):
        self.i, self.port, self.fate, self.killed = i, port, fate, False
        self.phases, self.log = tmp / f"phases-{i}.jsonl", tmp / f"out-{i}.log"
        self.log.write_text(f"start {i}\n")
        if fate in ("reach", "linger"):
            at = time.time() + (1000 if fate == "linger" else 0)        # linger: reached, after the bound
            self.phases.write_text("".join(f'{{"phase": "first_step", "rank": {r}, "time": {at}}}\n' for r in (0, 1)))
        self.flying = flying
        assert port not in [f.port for f in flying], "a port handed out twice"
        flying.append(self)

    def ended(self) -> bool:
        done = self.killed or self.fate in ("reach", "fail")
        if done and self in self.flying:
            self.flying.remove(self)
        return done

    def processes(self) -> list[int]:
        return []

    def kill(self) -> None:
        self.killed = True
        self.ended()


def test_starts_in_flight_are_at_most_parallel_and_each_outcome_is_counted_apart(tmp_path, monkeypatch):
    import argparse

    starts = _starts()
    monkeypatch.setattr(starts, "FINISH", 0.3)
    fates = ["reach", "fail", "stuck", "reach", "linger", "reach", "reach"]
    flying, made, most = [], [], []

    def start(i, port):
        most.append(len(flying))              # those in flight when this one begins
        made.append(_Fake(tmp_path, i, port, fates[i], flying))
        return made[-1]

    args = argparse.Namespace(via="torchrun", parallel=2, starts=len(fates), bound=0.5, max_minutes=0,
                              port_base=40000)
    keep = tmp_path / "keep"
    keep.mkdir()
    r = starts.starts(args, start, keep, poll=0.01)
    assert max(most) == 1 and len(made) == len(fates)        # never a third one beside two in flight
    assert r["starts"] == 7 and r["reached"] == 4 + 1 and len(r["times"]) == 5
    assert r["within"] == 4       # the one that reached 1000 s after it began is not within the bound
    assert r["failed"] == [1] and (keep / "failed-1.log").read_text() == "start 1\n"
    assert r["stuck"] == [2] and made[2].killed and "no first step on rank(s) [0, 1]" in (keep / "stuck-2.txt").read_text()
    assert r["unfinished"] == [4] and made[4].killed         # reached, did not end: killed, counted apart
    assert not any(m.killed for m in made if m.fate in ("reach", "fail")) and not flying


def test_ports_never_hand_out_one_in_flight_and_the_longest_free_comes_first():
    ports = _starts().Ports(100, 3)
    a, b = ports.take(), ports.take()
    ports.give(a)
    assert (a, b) == (100, 101) and [ports.take(), ports.take()] == [102, 100] and not ports.free


def test_a_stuck_starts_stacks_end_with_the_cpu_each_process_used_while_they_were_taken(monkeypatch):
    starts = _starts()
    monkeypatch.setattr(starts, "PY_SPY", None)
    spin = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    idle = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        end = time.monotonic() + 60                     # a loaded machine gives the spinner its 0.5 s slowly
        while starts.cpu_s(spin.pid) < 0.5 and time.monotonic() < end:
            time.sleep(0.1)
        assert starts.cpu_s(spin.pid) >= 0.5 and starts.cpu_s(idle.pid) < 0.3
        text = starts.stacks([spin.pid, idle.pid])
    finally:
        spin.kill(), idle.kill(), spin.wait(), idle.wait()
    assert f"===== pid {spin.pid}: " in text and "CPU seconds of each process" in text
    assert f"pid {idle.pid}: " in text.rsplit("CPU seconds", 1)[1]
    assert starts.cpu_s(spin.pid) is None                   # gone
