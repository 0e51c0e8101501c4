"""`clusterctl report` on the testbed (issue 38's acceptance): a 2-node podman job (the quickstart, a `step N`
line per step) whose worker node is killed mid-run: the report accounts for the wall time within 1 % (and its
wall time is the ledger's), its one disruption names the node, its `lost_steps` equals the steps trained twice
(rank 0's own record of every step), its `first_step_at - fault_at` is within 1 s of the recovery measured from
that record, the relaunch was warm; `--plot` writes a valid PNG and SVG; the job dir keeps `goodput.json` (the same
report) and `events.jsonl` (every event of the job, in order). Then a job that prints no step line: the report
says what it cannot tell (no productive time, no goodput, no lost steps) instead of guessing."""
from __future__ import annotations

import json
import time
import xml.etree.ElementTree as ET
from pathlib import Path

from clusterctl.store import paths
from tests.integration import recovery_harness as rh
from tests.testbed import profile

OK = Path(__file__).resolve().parent / "jobs" / "ok.py"


def report(run: rh.Run, *args: str) -> dict:
    return json.loads(run.cli("report", run.name, "-o", "json", *args, timeout=60).stdout)


def test_a_node_kill_in_the_report_and_a_job_without_steps(make_testbed, tmp_path):
    tb = make_testbed(2, [profile(gpus=0)] * 2)
    run = rh.new_run(tb, tmp_path / "kill", "goodputkill", steps=90, every=10, nodes="1:2",
                     extra_args=["--log-every", "1"])
    bare = rh.new_run(tb, tmp_path / "ok", "goodputnosteps", script=OK, nodes=2, recovery="cold")
    try:
        run.launch()
        run.wait_step(15)
        rh.wait_zygotes(run)
        victim = rh.other_host(run)
        t = time.time()
        assert tb.kill(victim, pattern=rh.JOB_PATTERN)
        st = run.wait_end(300)
        assert st["state"] == "SUCCEEDED", f"{st['state']}: {st['reason']}\n{run.events_text()}"
        truth = rh.check_steps(run)
        first = min(r["time"] for r in run.steps_log() if str(r["attempt"]) == "2")
        measured = first - t

        r = report(run)
        events = run.events()
        start = next(e["time"] for e in events if e["kind"] == "start")
        end = next(e["time"] for e in events if e["kind"] == "end")
        assert abs(r["wall_s"] - (end - start)) <= 0.01 * (end - start), (r["wall_s"], end - start)
        accounted = r["productive_s"] + sum(r["badput_s"].values())
        assert abs(accounted - r["wall_s"]) <= 0.01 * r["wall_s"], r
        assert 0 < r["goodput"] <= 1 and r["steps"]["first"] == 1 and r["steps"]["last"] == 90, r
        (d,) = r["disruptions"]
        assert (d["attempt"], d["node"], d["recovery"]) == (1, victim, "warm"), d
        assert d["lost_steps"] == truth["trained_twice"], (d, truth)
        assert abs((d["first_step_at"] - d["fault_at"]) - measured) <= 1.0, (d, measured)
        assert d["fault_at"] <= d["detected_at"] <= d["stopped_at"] <= d["restarted_at"] <= d["first_step_at"], d
        print(f"report: wall {r['wall_s']}s, goodput {r['goodput']}, lost {d['lost_steps']} steps "
              f"({d['lost_s']}s); fault -> first step {d['first_step_at'] - d['fault_at']:.2f}s (measured "
              f"{measured:.2f}s)")

        for ext in ("png", "svg"):
            f = tmp_path / f"report.{ext}"
            run.cli("report", run.name, "--plot", str(f), timeout=90)
            data = f.read_bytes()
            if ext == "png":
                assert data[:8] == b"\x89PNG\r\n\x1a\n" and b"IEND" in data[-16:]
            else:
                assert ET.fromstring(data).tag.endswith("svg")
        print(f"plots: {tmp_path}/report.png, .svg")

        d_job = paths.job_dir(run.state_dir, run.job_row().job_id)
        kept = json.loads((d_job / "goodput.json").read_text())
        assert (kept["wall_s"], kept["productive_s"], kept["disruptions"]) == \
            (r["wall_s"], r["productive_s"], r["disruptions"])
        mirrored = [json.loads(line) for line in (d_job / "events.jsonl").read_text().splitlines()]
        ids = [e["id"] for e in mirrored]
        assert ids == sorted(set(ids)) and [m["kind"] for m in mirrored].count("start") == 2
        assert {"verdict", "gang_stop", "relaunch", "checkpoint", "end"} <= {m["kind"] for m in mirrored}

        bare.launch()
        st = bare.wait_end(120)
        assert st["state"] == "SUCCEEDED", f"{st['state']}: {st['reason']}\n{bare.events_text()}"
        r = report(bare)
        assert r["wall_s"] > 0 and r["productive_s"] is None and r["goodput"] is None and r["steps"] is None
        assert any("no step signal" in u for u in r["unknown"]), r
        text = bare.cli("report", bare.name, timeout=60).stdout
        assert "goodput unknown" in text and "cannot tell: no step signal" in text, text
    finally:
        rh.stop_unless_done(run)
        rh.stop_unless_done(bare)
