"""The quickstart resumed at its final step (a node lost right after the last checkpoint): every rank says there
is nothing left to train and exits 0, also with another world size (a relaunch on fewer nodes)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
TORCHRUN = Path(sys.executable).parent / "torchrun"


def _train(tmp_path: Path, nproc: int) -> subprocess.CompletedProcess:
    env = {**os.environ, "CLUSTERCTL_CHECKPOINT_DIR": str(tmp_path / "ck"), "PYTHONPATH": str(REPO),
           "OMP_NUM_THREADS": "1"}
    return subprocess.run([str(TORCHRUN), "--standalone", f"--nproc-per-node={nproc}",
                           str(REPO / "examples/quickstart/train.py"), "--steps", "6", "--checkpoint-every", "3",
                           "--workers", "0"], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=240)


def test_resumed_at_the_final_step_with_another_world_size_exits_0(tmp_path):
    first = _train(tmp_path, 2)
    assert first.returncode == 0, first.stdout[-2000:] + first.stderr[-3000:]
    again = _train(tmp_path, 1)
    assert again.returncode == 0, again.stdout[-2000:] + again.stderr[-3000:]
    assert "resumed there: nothing left to train" in again.stdout
