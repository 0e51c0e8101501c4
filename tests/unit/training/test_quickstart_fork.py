"""The quickstart forks its DataLoader workers while the rank has no other thread (issue 34 item 12).

A first attempt now and then never trained: one rank waiting on its DataLoader workers in ``select``, the others
in DDP's first forward, until the supervisor's hang verdict. The workers were forked by ``iter(loader)`` after
``init_process_group``, when gloo's threads (a TCP loop and two work threads) run in the rank: a forked child of a
threaded process gets only the forking thread and a copy of every lock as it was at that instant, so POSIX allows
it only async-signal-safe calls until it execs (a DataLoader worker never execs). The quickstart now forks them
before the process group exists. This test records, at every fork of the rank (``os.register_at_fork``), the
threads the rank had."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

TRAIN = Path(__file__).resolve().parents[3] / "examples" / "quickstart" / "train.py"

RECORDER = '''import os
def _threads_at_fork():
    names = []
    for t in os.listdir("/proc/self/task"):
        try:
            names.append(open(f"/proc/self/task/{t}/comm").read().strip())
        except OSError:
            pass
    with open(os.environ["FORK_RECORD"], "a") as f:
        f.write(" ".join(sorted(names)) + "\\n")
if os.environ.get("FORK_RECORD"):
    os.register_at_fork(before=_threads_at_fork)
'''


def test_the_dataloader_workers_are_forked_before_the_process_group_starts_its_threads(tmp_path):
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "sitecustomize.py").write_text(RECORDER)
    record = tmp_path / "forks.txt"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path / "site"), os.environ.get("PYTHONPATH", "")]),
           "FORK_RECORD": str(record), "OMP_NUM_THREADS": "1"}    # as the quickstart runs (job.yaml, torchrun)
    r = subprocess.run([sys.executable, str(TRAIN), "--steps", "2", "--workers", "2", "--checkpoint-every", "0"],
                       capture_output=True, text=True, timeout=300, cwd=str(tmp_path), env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    forks = record.read_text().splitlines()
    assert len(forks) == 2, forks                    # the two workers, forked once (persistent)
    assert all(len(f.split()) == 1 for f in forks), f"threads of the rank at each fork: {forks}"
