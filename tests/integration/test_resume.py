"""Exact resume, on the testbed: the quickstart (Dataset, ResumableDistributedSampler, DataLoader with 2 workers,
DDP, dropout, Adam + LR schedule; 3 nodes x 2 ranks, gloo on CPU, podman) launched with the real CLI.

* same world size (3 nodes x 2 ranks): the job uninterrupted vs. the same job with a rank SIGKILLed mid-epoch -> the
  final parameters are bit-identical (torch.equal on every tensor of the final checkpoint), and so is every
  step's loss;
* elastic shrink 3 -> 2 nodes (6 -> 4 ranks) mid-epoch: a ledger of the sample ids every rank trained on shows every sample of
  every epoch consumed exactly once (the steps the lost attempt trained after its last checkpoint are not part of
  the run: they are dropped at the resume point), and the final loss is within noise of the uninterrupted run.
"""
from __future__ import annotations

import json
import os
import signal
import statistics
from collections import Counter
from pathlib import Path

import pytest
import torch
import yaml

from clusterctl.sampler import epoch_order
from tests.integration import recovery_harness as rh

DATASET, SEED = 3072, 1234           # the quickstart's (examples/quickstart/train.py)
BATCH = 32
STEPS, EVERY = 60, 10                 # 6 ranks x 32: 16 steps per epoch; 4 ranks: 24
KILL_AFTER = 25                       # epoch 1, step 9 of 16; every checkpoint step (10, 20, ...) is mid-epoch


def make_run(tb, tmp: Path, name: str, nodes: str, nproc: int = 2, step_time: float = 0.05) -> rh.Run:
    tmp.mkdir(parents=True, exist_ok=True)
    shared = Path(tb.shared) / name
    shared.mkdir(parents=True, exist_ok=True)
    inv = tb.inventory(tmp / "inventory.yaml", runtime="podman", hosts=[h.name for h in tb.hosts[:3]])
    data = yaml.safe_load(inv.read_text())
    for host in data["all"]["hosts"].values():      # CPU training: no GPU (CDI) devices in the containers
        host["clusterctl_gpus"] = 0
    inv.write_text(yaml.safe_dump(data, sort_keys=False))
    job = rh.job_yaml(tmp / "job.yaml", shared, name=name, steps=STEPS, every=EVERY, step_time=step_time, nodes=nodes, nproc=nproc,
                      extra_args=["--ledger", str(shared / "ledger"), "--batch-size", str(BATCH)],
                      restarts={"max_failures": 2, "backoff_s": 0.2})
    return rh.Run(tb, tmp / "state", inv, job, name, STEPS, shared / "steps.jsonl")


def final_model(run: rh.Run) -> dict:
    path = run.record.parent / "ckpt" / f"step-{STEPS:09d}" / "state.pt"
    return torch.load(path, weights_only=True)["model"]


def resume_points(run: rh.Run) -> dict[str, int]:
    """attempt -> the step it resumed from (its first trained step - 1)."""
    first: dict[str, int] = {}
    for r in run.steps_log():
        first.setdefault(r["attempt"], r["step"] - 1)
    return first


def ledger(run: rh.Run) -> list[dict]:
    """The ledger lines that made the final model: an attempt's steps up to where the next attempt resumed."""
    starts = resume_points(run)
    attempts = sorted(starts, key=int)
    upto = {a: starts[b] for a, b in zip(attempts, attempts[1:])}
    out = []
    for f in sorted(run.record.parent.glob("ledger-a*-r*.jsonl")):
        attempt = f.name.split("-a")[1].split("-r")[0]
        for line in f.read_text().splitlines():
            try:
                rec = json.loads(line)
            except ValueError:
                continue                                  # a line cut by the SIGKILL
            if rec["step"] <= upto.get(attempt, STEPS):
                out.append(rec)
    return out


def losses(run: rh.Run) -> dict[int, float]:
    last: dict[int, float] = {}
    for r in run.steps_log():
        last[r["step"]] = r["loss"]                       # a replayed step: the attempt that counted wrote last
    return last


@pytest.fixture
def cleanup():
    runs: list[rh.Run] = []
    yield runs.append
    for run in runs:
        stop(run)


def finish(run: rh.Run) -> dict:
    st = run.wait_end(420)
    assert st["state"] == "SUCCEEDED", f"{st['state']}: {st['reason']}\n{run.events_text()}"
    return st


def stop(run: rh.Run) -> None:
    """No supervisor outlives its test."""
    rh.stop_unless_done(run)
    for line in run.log[-4:]:
        print(line)


def uninterrupted(tb, tmp: Path, name: str, nodes: str, nproc: int, world: int) -> rh.Run:
    run = make_run(tb, tmp, name, nodes=nodes, nproc=nproc)
    run.launch()
    st = finish(run)
    assert st["attempt"] == 1
    assert {r["world_size"] for r in run.steps_log()} == {world}
    return run


@pytest.fixture(scope="module")
def reference(testbed, tmp_path_factory):
    """The job uninterrupted on 3 nodes x 2 ranks (world size 6)."""
    runs = []
    try:
        runs.append(uninterrupted(testbed, tmp_path_factory.mktemp("resume-ref"), "rsref", "3", 2, 6))
        yield runs[0]
    finally:
        for run in runs:
            stop(run)


def test_a_rank_killed_mid_epoch_resumes_bit_identically(testbed, tmp_path, reference, cleanup):
    # slower steps (the sleep only: the same math as the reference) so that every node's zygote is up before the
    # kill: the relaunch is warm, and must still be bit-identical
    run = make_run(testbed, tmp_path, "rsexact", nodes="3", step_time=0.2)
    cleanup(run)
    run.launch()
    rh.wait_zygotes(run)
    run.wait_step(KILL_AFTER)
    victim = rh.other_host(run)
    os.kill(rh.rank_pids(testbed, victim)[0], signal.SIGKILL)
    st = finish(run)
    assert st["attempt"] == 2 and len(st["nodes"]) == 3, st
    # recovery is warm by default: every node's relaunch was forked from its zygote, and still bit-identical
    warm = {e["node"]: e["class"] for e in run.events() if e["kind"] == "relaunch" and e["attempt"] == 2}
    assert warm == {n: "warm" for n in warm} and len(warm) == 3, run.events_text()
    starts = resume_points(run)
    resumed = sorted(starts.values())[1]
    assert resumed > 0 and resumed % EVERY == 0 and resumed % 16 != 0, starts   # a mid-epoch checkpoint
    assert {r["world_size"] for r in run.steps_log()} == {6}
    rh.check_steps(run)

    want, got = final_model(reference), final_model(run)
    assert want.keys() == got.keys()
    different = [k for k in want if not torch.equal(want[k], got[k])]
    assert not different, f"parameters differ after the resume: {different}"
    assert losses(run) == losses(reference), "the loss trajectory differs"
    rh.check_clean(run)


def test_elastic_shrink_consumes_every_sample_exactly_once(testbed, tmp_path, reference, cleanup):
    ref = reference
    run = make_run(testbed, tmp_path, "rselastic", nodes="2:3")
    cleanup(run)
    run.launch()
    run.wait_step(KILL_AFTER)
    victim = rh.other_host(run)
    assert testbed.kill(victim, pattern=rh.JOB_PATTERN)
    st = finish(run)
    assert st["attempt"] == 2 and len(st["nodes"]) == 2 and victim not in [n["node"] for n in st["nodes"]], st
    worlds = [r["world_size"] for r in run.steps_log()]
    assert worlds[0] == 6 and worlds[-1] == 4, sorted(set(worlds))
    rh.check_steps(run)

    lines = ledger(run)
    steps = Counter((r["step"], r["rank"]) for r in lines)
    assert all(n == 1 for n in steps.values()), "a (step, rank) was trained twice in the kept ledger"
    by_epoch: dict[int, list[int]] = {}
    for r in lines:
        by_epoch.setdefault(r["epoch"], []).extend(r["ids"])
    assert sorted(by_epoch) == list(range(len(by_epoch))) and len(by_epoch) >= 3, sorted(by_epoch)
    *complete, last = sorted(by_epoch)
    for e in complete:
        ids = by_epoch[e]
        assert sorted(ids) == list(range(DATASET)), (
            f"epoch {e}: {len(ids) - len(set(ids))} repeated, {DATASET - len(set(ids))} missing")
    ids = by_epoch[last]                                  # the run ends mid-epoch: a prefix of the epoch's order
    assert len(ids) == len(set(ids)), f"epoch {last}: samples repeated"
    assert set(ids) == set(epoch_order(DATASET, last, SEED)[: len(ids)])

    # the same schedule of samples for the steps before the shrink, another one after: the loss is within noise
    mine, theirs = losses(run), losses(ref)
    tail = range(STEPS - 9, STEPS + 1)
    ref_tail = [theirs[s] for s in tail]
    noise = statistics.pstdev(ref_tail)
    diff = abs(statistics.mean(mine[s] for s in tail) - statistics.mean(ref_tail))
    assert diff <= max(3 * noise, 0.25 * statistics.mean(ref_tail)), (diff, noise, ref_tail)
    rh.check_clean(run)
