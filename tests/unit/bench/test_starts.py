"""bench/starts.py: a start run as one child process (torchrun here, or `clusterctl launch` of the embedded default)
ends and finishes by one piece of code (``Child``; it was written out twice, the same each time)."""
from __future__ import annotations

import subprocess
import sys
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
