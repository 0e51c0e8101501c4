"""The quickstart's ``--phases FILE``: each rank records when it started, had torch, joined the process group,
loaded its checkpoint and made its first step (what bench/recovery.py's phase breakdown reads)."""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

TRAIN = Path(__file__).resolve().parents[3] / "examples" / "quickstart" / "train.py"


def test_phases_are_recorded_once_each_in_order(tmp_path):
    out = tmp_path / "phases.jsonl"
    t0 = time.time()
    r = subprocess.run([sys.executable, str(TRAIN), "--steps", "3", "--workers", "0", "--phases", str(out)],
                       capture_output=True, text=True, timeout=300, cwd=str(tmp_path))
    assert r.returncode == 0, r.stderr[-2000:]
    recs = [json.loads(line) for line in out.read_text().splitlines()]
    assert [x["phase"] for x in recs] == ["started", "torch", "process_group", "checkpoint", "first_step"]
    times = [x["time"] for x in recs]
    assert t0 - 1 <= times[0] and times == sorted(times) and times[-1] <= time.time()
    assert recs[1]["cpu"] > 0.1 and all(x["rank"] == 0 for x in recs)     # importing torch costs CPU
