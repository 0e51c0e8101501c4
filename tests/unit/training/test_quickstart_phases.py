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


def test_agent_cpu_counts_this_attempts_torchrun_on_this_node_only(tmp_path, monkeypatch):
    """Local rank 0 records the CPU of its node's torchrun agent of this attempt: a process torch named
    pt_elastic, in this network namespace, with CLUSTERCTL_ATTEMPT=<attempt> (or none: forked by a zygote).
    /proc is listed as holding only the test's own processes: a real torchrun of another test running meanwhile
    (test_rankview's, on the other xdist worker) is an agent of no attempt, which counts for every attempt."""
    import importlib.util
    import os

    spec = importlib.util.spec_from_file_location("quickstart_train", TRAIN)
    train = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(train)
    exe = tmp_path / "pt_elastic"                   # comm is the name the program was started by
    exe.symlink_to(sys.executable)
    burn = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.3: pass\nprint('ok', flush=True)\n" \
           "time.sleep(60)\n"
    agents = [subprocess.Popen([str(exe), "-c", burn], env=dict(os.environ, CLUSTERCTL_ATTEMPT=a),
                               stdout=subprocess.PIPE, text=True) for a in ("5", "4")]
    try:
        for p in agents:
            assert p.stdout.readline().strip() == "ok"
        real_listdir = os.listdir
        ours = [str(os.getpid()), *(str(p.pid) for p in agents)]
        monkeypatch.setattr(train.os, "listdir", lambda d: ours if d == "/proc" else real_listdir(d))
        got = train.agent_cpu("5")
        assert got is not None and 0.25 <= got < 2.0         # attempt 5's agent only, not attempt 4's
        assert train.agent_cpu("6") is None
    finally:
        for p in agents:
            p.kill()
            p.wait()
