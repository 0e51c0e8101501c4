"""clusterctl.rankview: the wrapper every rank runs through (python's own semantics, exit codes, torchrun's
@record), the monitor's view of a real 2-rank gloo group on localhost (a blocked rank still, its peer waiting in
the collective), and the dump a hang keeps (torch's analyzer reads it)."""
from __future__ import annotations

import json
import os
import threading
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from clusterctl import rankview

REPO = Path(__file__).resolve().parents[3]
ENV = {**os.environ, "PYTHONPATH": str(REPO)}
ENV.pop(rankview.VIEW_DIR_VAR, None)

PROBE = """import os, sys
print("argv", sys.argv)
print("path0", sys.path[0])
print("name", __name__, "file", __file__)
print("main", sys.modules["__main__"].__dict__ is globals())
how = os.environ.get("HOW", "")
if how == "exit3":
    sys.exit(3)
if how == "exitmsg":
    raise SystemExit("goodbye")
if how == "raise":
    raise ValueError("boom")
"""


def _py(args, cwd, how=""):
    r = subprocess.run([sys.executable, *args], cwd=cwd, env={**ENV, "HOW": how}, capture_output=True, text=True,
                       timeout=60)
    return r.returncode, r.stdout, r.stderr


@pytest.mark.parametrize("how", ["", "exit3", "exitmsg", "raise"])
def test_a_script_runs_as_python_runs_it(tmp_path, how):
    (tmp_path / "d").mkdir()
    script = tmp_path / "d" / "probe.py"
    script.write_text(PROBE)
    cwd = tmp_path
    plain = _py(["d/probe.py", "a", "-b", "--c=1"], cwd, how)
    wrapped = _py(["-m", "clusterctl.rankview", "d/probe.py", "a", "-b", "--c=1"], cwd, how)
    assert wrapped[0] == plain[0] == {"": 0, "exit3": 3, "exitmsg": 1, "raise": 1}[how]
    assert wrapped[1] == plain[1]
    assert f"path0 {tmp_path / 'd'}" in plain[1] and "argv ['d/probe.py', 'a', '-b', '--c=1']" in plain[1]
    assert f"name __main__ file {script}" in plain[1] and "main True" in plain[1]
    if how == "exitmsg":
        assert wrapped[2] == plain[2] == "goodbye\n"
    if how == "raise":     # the same error, its traceback ends the same way (the wrapper's frames above it)
        assert wrapped[2].splitlines()[-1] == plain[2].splitlines()[-1] == "ValueError: boom"


def test_a_misspelt_script_fails_as_python_fails(tmp_path):
    """python's own line and exit code 2: the supervisor reads it as a config error (causes.CANT_OPEN), not as
    a user error to retry (CI: the wrapper's runpy raised FileNotFoundError, a traceback)."""
    from clusterctl.model import causes
    plain = _py(["d/tran.py", "a"], tmp_path)
    wrapped = _py(["-m", "clusterctl.rankview", "d/tran.py", "a"], tmp_path)
    assert wrapped == plain and plain[0] == 2
    assert causes.CANT_OPEN.search(wrapped[2]), wrapped[2]


def test_a_module_runs_as_python_minus_m_runs_it(tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "probe.py").write_text(PROBE)
    for how, code in (("", 0), ("exit3", 3), ("raise", 1)):
        plain = _py(["-m", "pkg.probe", "x", "-m", "y"], tmp_path, how)
        wrapped = _py(["-m", "clusterctl.rankview", "-m", "pkg.probe", "x", "-m", "y"], tmp_path, how)
        assert wrapped[0] == plain[0] == code
        assert wrapped[1] == plain[1]
        assert f"argv ['{pkg / 'probe.py'}', 'x', '-m', 'y']" in plain[1] and f"path0 {tmp_path}\n" in plain[1]


def test_no_view_dir_no_monitor_thread(tmp_path):
    (tmp_path / "t.py").write_text("import os, threading, time\nprint(sorted(t.name for t in threading.enumerate()))\n"
                                   "end = time.time() + 10\n"        # its first view comes from the thread, at once
                                   "while os.environ.get('RANK') and not os.path.exists('rank-7') and time.time() < end:\n"
                                   "    time.sleep(0.05)\n")
    out = _py(["-m", "clusterctl.rankview", "t.py"], tmp_path)[1]
    assert out.strip() == "['MainThread']"
    env = {**ENV, rankview.VIEW_DIR_VAR: str(tmp_path), "RANK": "7"}
    r = subprocess.run([sys.executable, "-m", "clusterctl.rankview", "t.py"], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=60)
    assert "clusterctl-rankview" in r.stdout
    view = json.loads((tmp_path / "rank-7").read_text())
    assert view["rank"] == 7 and view["v"] == 1 and view["n"] >= 1 and view["pid"] > 0
    # its start time (/proc/PID/stat field 22) and clock rate: the node's watch reads its CPU from outside by them
    assert isinstance(view["start"], int) and view["start"] > 0 and view["hz"] == os.sysconf("SC_CLK_TCK")
    assert oct((tmp_path / "rank-7").stat().st_mode & 0o777) == "0o600"


# ------------------------------------------------------------------------------------------------ pure parts
def test_the_last_entries_of_a_dump_are_read_from_its_tail():
    entries = [{"collective_seq_id": i, "pg_id": 0, "profiling_name": "gloo:all_reduce",
                "time_created_ns": 1000 + i, "input_sizes": [[1, 2]]} for i in range(1, 101)]
    data = json.dumps({"entries": entries, "pg_status": {"0": {}}}, separators=(",", ":")).encode()
    got = rankview.last_entries(data, 5)
    assert [e["collective_seq_id"] for e in got] == [96, 97, 98, 99, 100]
    assert got[-1]["input_sizes"] == [[1, 2]]
    assert rankview.last_entries(b"{}", 5) == []


def test_waiting_in_names_the_collective_and_how_long():
    entries = [{"collective_seq_id": 7, "pg_id": 0, "profiling_name": "gloo:all_reduce", "time_created_ns": 1_000_000_000}]
    assert rankview.waiting_in({"0": (7, 6)}, entries, 3_500_000_000) == \
        {"pg": "0", "seq": 7, "op": "all_reduce", "for_s": 2.5}
    assert rankview.waiting_in({"0": (7, 7)}, entries, 3_500_000_000) is None
    assert rankview.waiting_in({"0": (8, 7)}, entries, 0)["op"] is None      # not in the entries read


class _Clock:
    def __init__(self):
        self.t = 100.0

    def __call__(self):
        return self.t


def _monitor(tmp_path, clock, cpu, io, stack, running=None):
    m = rankview.Monitor(str(tmp_path), rank=0, local_rank=0, progress=rankview.Progress(clock), clock=clock)
    m.main_running = lambda: bool(running and running[0])
    m.cpu_s = lambda: cpu[0]
    m.io = lambda: io[0]
    m.where = lambda: ("x.py:1 f", stack[0])
    return m


def test_state_hints_from_progress_cpu_io_and_stack(tmp_path):
    clock, cpu, io, stack = _Clock(), [1.0], [10], ["aaaa0000"]
    m = _monitor(tmp_path, clock, cpu, io, stack)
    assert m.tick()["state"] == "starting"
    m.progress.on_step()
    clock.t += 1
    assert m.tick()["state"] == "training"
    for _ in range(3):                 # no step for 3 s, but computing: busy
        clock.t += 1
        cpu[0] += 0.5
        d = m.tick()
    assert d["state"] == "busy" and d["step"] == 1 and d["step_age_s"] == 4.0
    for _ in range(4):                 # no CPU, no I/O, the same stack for 3 s: still
        clock.t += 1
        d = m.tick()
    assert d["state"] == "still"
    clock.t += 1
    io[0] += 4096                      # writing (a slow checkpoint): busy
    assert m.tick()["state"] == "busy"
    for _ in range(4):
        clock.t += 1
        m.tick()
    assert m.tick()["state"] == "still"
    stack[0] = "bbbb0000"              # its stack moves: not still
    clock.t += 1
    assert m.tick()["state"] == "busy"
    view = json.loads((tmp_path / "rank-0").read_text())
    assert view["n"] == m.n and view["where"] == "x.py:1 f" and view["stack"] == "bbbb0000"


def test_a_rank_whose_main_thread_runs_is_busy_however_little_cpu_its_node_gives_it(tmp_path):
    """On a loaded node a computing rank gets a few hundredths of a CPU-second in 3 s: below what counts as CPU
    advancing. Its main thread is running (R) all the while: busy, never still (the soak's false hangs)."""
    clock, cpu, io, stack, running = _Clock(), [1.0], [10], ["aaaa0000"], [True]
    m = _monitor(tmp_path, clock, cpu, io, stack, running)
    m.progress.on_step()
    for _ in range(6):
        clock.t += 1
        cpu[0] += 0.01
        d = m.tick()
    assert d["state"] == "busy"
    running[0] = False                 # it stopped running: still 3 s later
    for _ in range(4):
        clock.t += 1
        d = m.tick()
    assert d["state"] == "still"


def test_the_monitor_sees_its_main_thread_running_or_asleep(tmp_path):
    import threading

    m = rankview.Monitor(str(tmp_path), rank=0, local_rank=0, progress=rankview.Progress())
    assert m.main_running() is True                # this thread runs the test: it asks about itself
    seen = []
    t = threading.Thread(target=lambda: (time.sleep(0.3), seen.append(m.main_running())))
    t.start()
    time.sleep(1.0)                                # the main thread asleep while the other one asks
    t.join()
    assert seen == [False]


def test_the_monitors_own_reads_and_writes_are_not_the_ranks_io(tmp_path):
    m = rankview.Monitor(str(tmp_path), rank=0, local_rank=0, progress=rankview.Progress())
    first = m.tick()["io"]
    for _ in range(3):
        last = m.tick()["io"]
    assert first == last


# ------------------------------------------------------------------------------------------------ a real group
JOB = """import os, sys, time, datetime
import torch, torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record


def blocked_in_own_code(release):
    while not os.path.exists(release):
        time.sleep(0.2)


@record
def main():
    release = sys.argv[1]
    dist.init_process_group("gloo", timeout=datetime.timedelta(minutes=5))
    rank = dist.get_rank()
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(5):
        opt.zero_grad()
        model(torch.ones(2, 4)).sum().backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
        opt.step()
    print("hang", rank, flush=True)
    if rank == 1:
        blocked_in_own_code(release)
    dist.all_reduce(torch.ones(1))
    if rank == 1:
        raise ValueError("rank one fails on purpose")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _view(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def test_a_blocked_rank_is_still_its_peer_waits_the_dump_reads_and_record_names_the_rank(tmp_path):
    """torchrun, 2 ranks, gloo, through the wrapper: after 5 steps rank 1 blocks in its own code; rank 0 waits in
    all_reduce. The views say so (steps counted by the optimizer hook, the collective named, where rank 1 is); the
    dump trigger gets both ranks' flight records, which torch's analyzer reads (gloo's pg_config repaired) and
    which say rank 1 is missing; released, rank 1 raises under @record and torchrun's Root Cause names it."""
    script = tmp_path / "job.py"
    script.write_text(JOB)
    view = tmp_path / "view"
    view.mkdir()
    release = tmp_path / "release"
    torchrun = Path(sys.executable).parent / "torchrun"
    env = {**ENV, rankview.VIEW_DIR_VAR: str(view), "TORCH_FR_BUFFER_SIZE": "2000", "OMP_NUM_THREADS": "1"}
    p = subprocess.Popen([str(torchrun), "--nproc-per-node=2", f"--master-port={_free_port()}",
                          "-m", "clusterctl.rankview", str(script), str(release)],
                         cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         start_new_session=True)
    try:
        end = time.monotonic() + 120
        v0 = v1 = None
        while time.monotonic() < end:
            v0, v1 = _view(view / "rank-0"), _view(view / "rank-1")
            # rank 1's arrivals are refreshed on its own 10 s clock: wait for the look after its last collective
            if v0 and v1 and v0["state"] == "waiting" and v1["state"] == "still" and v0.get("arrivals") \
                    and v1.get("arrivals") and v1["arrivals"][-1][0] == 10:
                break
            assert p.poll() is None, p.stdout.read()
            time.sleep(0.3)
        else:
            raise AssertionError(f"views: {v0}\n{v1}")
        assert v0["step"] == v1["step"] == 5 and v0["colls"] == v1["colls"] == 10
        assert v0["in"]["op"] == "all_reduce" and v0["in"]["seq"] == 11 and v0["in"]["for_s"] >= 1
        assert v1["in"] is None and v1["where"].endswith("blocked_in_own_code")
        assert list(v0["peers"]) == [str(v1["pid"])] and list(v1["peers"]) == [str(v0["pid"])]
        assert v0["peers"][str(v1["pid"])] in "SR" and v1["peers"][str(v0["pid"])] in "SR"    # not stopped
        assert [a[0] for a in v0["arrivals"]][-1] == 11 and [a[0] for a in v1["arrivals"]][-1] == 10
        (view / "dump").write_text("hang-1\n")
        dump = view / "hang-1"
        files = {"fr-0", "fr-1", "stack-0.txt", "stack-1.txt"}
        while time.monotonic() < end and not files <= {f.name for f in dump.glob("*")}:
            time.sleep(0.2)
        assert "blocked_in_own_code" in (dump / "stack-1.txt").read_text()
        analyzer = subprocess.run([sys.executable, "-m", "torch.distributed.flight_recorder.fr_trace", str(dump),
                                   "-p", "fr-"], env=ENV, capture_output=True, text=True, timeout=120)
        assert analyzer.returncode == 0, analyzer.stderr[-3000:]
        said = analyzer.stdout + analyzer.stderr        # it reports through logging (stderr)
        assert "missing ranks: {1}" in said and "gloo:all_reduce" in said, said
        release.touch()
        out, _ = p.communicate(timeout=60)
    finally:
        if p.poll() is None:      # a failed assertion: the ranks too (a SIGKILLed torchrun leaves them blocked)
            release.touch()
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    assert p.returncode == 1, out
    root = out[out.index("Root Cause"):]
    assert "rank      : 1 (local_rank: 1)" in root and "ValueError: rank one fails on purpose" in root, root


class _FR:
    """torch's flight-recorder calls, scripted: the status, and the whole dump (counted)."""

    def __init__(self):
        self.status = {"0": (3, 3)}
        self.dumps = 0
        self.created_ns = 0
        self.open: set[int] | None = None       # the collectives not retired (None: entries without the flag)

    def _dump_fr_trace_json(self, includeCollectives=True, onlyActive=False):
        enq, done = self.status["0"]
        st = {"pg_status": {"0": {"last_enqueued_collective": str(enq), "last_completed_collective": str(done)}}}
        if includeCollectives is False:
            return json.dumps(st).encode()
        self.dumps += 1
        entries = [{"collective_seq_id": i, "pg_id": 0, "profiling_name": "gloo:all_reduce",
                    "time_created_ns": self.created_ns + i} for i in range(1, enq + 1)]
        if self.open is not None:
            for e in entries:
                e["retired"] = e["collective_seq_id"] not in self.open
        return json.dumps({**st, "entries": entries}).encode()


def test_the_entries_are_read_once_per_collective_waited_in_and_every_10_s(tmp_path, monkeypatch):
    fr, clock = _FR(), _Clock()
    monkeypatch.setattr(rankview, "_fr", lambda: fr)
    m = rankview.Monitor(str(tmp_path), rank=0, local_rank=0, progress=rankview.Progress(clock), clock=clock)
    fr.created_ns = time.time_ns() - 10 * 10**9      # arrived 10 s ago (wall clock)
    m.tick()
    assert fr.dumps == 1                         # the first look at the arrivals
    fr.status["0"] = (4, 3)                      # in collective #4 from now on
    for _ in range(5):
        clock.t += 1
        d = m.tick()
    assert d["in"]["op"] == "all_reduce" and d["in"]["seq"] == 4 and fr.dumps == 2    # read once for #4
    assert d["state"] == "waiting"
    clock.t += 1
    fr.status["0"] = (5, 4)                      # #4 done, now in #5: its entries read once more
    m.tick()
    clock.t += 1
    d = m.tick()
    assert d["in"]["seq"] == 5 and fr.dumps == 3
    for _ in range(10):                          # 10 s on: the arrivals' look
        clock.t += 1
        m.tick()
    assert fr.dumps == 4


def test_completed_through_reads_the_retired_flags_of_the_tail():
    def e(seq, retired=True, pg=0):
        return {"collective_seq_id": seq, "pg_id": pg, "retired": retired}
    assert rankview.completed_through([e(i) for i in range(1, 11)], "0", 10) == 10
    assert rankview.completed_through([e(8), e(9, False), e(10), e(11, False)], "0", 11) == 8
    assert rankview.completed_through([e(9), e(10), e(11, False, pg=1)], "0", 10) == 10      # another group's
    assert rankview.completed_through([e(8), e(9)], "0", 10) is None           # the tail does not reach #10
    assert rankview.completed_through([{"collective_seq_id": 10, "pg_id": 0}], "0", 10) is None   # no flags


def test_a_rank_whose_pg_status_lags_its_retired_collectives_is_not_waiting(tmp_path, monkeypatch):
    """gloo's two worker threads each write last_completed_collective after their own collective: under load #4's
    write can land after #10's (seen in test_a_blocked_rank_... under -n 2: rank 1, blocked in its own code, read
    colls 4 and 'in all_reduce #10' for 114 s). The entries' retired flags say what completed."""
    fr, clock = _FR(), _Clock()
    monkeypatch.setattr(rankview, "_fr", lambda: fr)
    m = rankview.Monitor(str(tmp_path), rank=1, local_rank=1, progress=rankview.Progress(clock), clock=clock)
    fr.created_ns = time.time_ns() - 60 * 10**9
    fr.open = set()                              # every collective completed ...
    fr.status["0"] = (10, 10)
    m.tick()
    fr.status["0"] = (10, 4)                     # ... and #4's late write lands last
    for _ in range(8):
        clock.t += 1
        d = m.tick()
        assert d["in"] is None and d["state"] != "waiting" and d["colls"] == 10, d
    # a rank that did not see #10 complete first: its entries correct the lagging count
    fr2 = _FR()
    monkeypatch.setattr(rankview, "_fr", lambda: fr2)
    (tmp_path / "b").mkdir()
    m2 = rankview.Monitor(str(tmp_path / "b"), rank=0, local_rank=0, progress=rankview.Progress(clock),
                          clock=clock)
    fr2.created_ns, fr2.open, fr2.status["0"] = time.time_ns() - 60 * 10**9, set(), (10, 4)
    for _ in range(4):
        clock.t += 1
        d = m2.tick()
    assert d["in"] is None and d["state"] != "waiting" and d["colls"] == 10, d
    # waiting in #11 with #10's write lost: in #11, 10 completed (ci6 read rank 0's colls as 9)
    fr2.open, fr2.status["0"] = {11}, (11, 9)
    for _ in range(4):
        clock.t += 1
        d = m2.tick()
    assert d["in"]["seq"] == 11 and d["state"] == "waiting" and d["colls"] == 10, d


def test_gpu_fields_once_the_rank_uses_cuda(tmp_path, monkeypatch):
    """Where a rank uses CUDA: its device's reserved memory (the caching allocator's count) and its utilisation from
    NVML itself (a stub libnvidia-ml.so.1, asked for the device's PCI bus id: no pynvml); NVML missing: utilisation
    None, not asked again; no CUDA: no GPU fields."""
    import types

    from tests.testbed.stubs import libnvml

    props = {5: types.SimpleNamespace(pci_domain_id=0, pci_bus_id=0x1b, pci_device_id=0),
             0: types.SimpleNamespace(pci_domain_id=0, pci_bus_id=0x06, pci_device_id=0)}
    asked = []
    cuda = types.SimpleNamespace(is_initialized=lambda: True, device_count=lambda: 8,
                                 memory_reserved=lambda d: 1 << 30,
                                 get_device_properties=lambda d: asked.append(d) or props[d])
    monkeypatch.setitem(sys.modules, "torch.cuda", cuda)
    nvml = rankview.Nvml(str(libnvml("00000000:1B:00.0", 87)))
    m = rankview.Monitor(str(tmp_path), rank=13, local_rank=5, progress=rankview.Progress(), nvml=nvml)
    d = m.tick()
    assert (d["gpu_util"], d["gpu_mem"]) == (87.0, 1 << 30) and asked == [5]
    assert m.tick()["gpu_util"] == 87.0 and asked == [5]       # the bus id is looked up once

    # a device NVML does not know (another bus id): no utilisation, and NVML is not asked again
    other = rankview.Monitor(str(tmp_path), rank=0, local_rank=0, progress=rankview.Progress(),
                             nvml=rankview.Nvml(str(libnvml("00000000:1B:00.0", 87))))
    cuda.device_count = lambda: 1
    d = other.tick()
    assert (d["gpu_util"], d["gpu_mem"]) == (None, 1 << 30) and other.nvml.off
    # no NVML library at all (no driver in the image): the same
    gone = rankview.Monitor(str(tmp_path), rank=1, local_rank=0, progress=rankview.Progress(),
                            nvml=rankview.Nvml(str(tmp_path / "libnvidia-ml.so.1")))
    d = gone.tick()
    assert (d["gpu_util"], d["gpu_mem"]) == (None, 1 << 30) and gone.nvml.off
    cuda.is_initialized = lambda: False
    assert "gpu_mem" not in m.tick()


def test_nvmls_bus_id_is_what_nvidia_smi_prints():
    import types

    # the device run's H200 (docs/benchmarks.md ## gpu): nvidia-smi's Bus-Id "00000000:00:06.0" is bus 0, device 6
    assert rankview.pci_bus_id(types.SimpleNamespace(pci_domain_id=0, pci_bus_id=0, pci_device_id=6)) == \
        "00000000:00:06.0"
    assert rankview.pci_bus_id(types.SimpleNamespace(pci_domain_id=1, pci_bus_id=0xb3, pci_device_id=0x1f)) == \
        "00000001:B3:1F.0"


def test_local_rank_0_forgets_the_files_of_ranks_no_longer_on_its_node(tmp_path):
    """After torchrun restarted the workers with other ranks (a re-rendezvous within the attempt), the node's old
    ranks' files would read as ranks that stopped answering: local rank 0 removes those outside its node's range."""
    for r in (2, 3, 4, 5, 11):
        (tmp_path / f"rank-{r}").write_text("{}\n")
    (tmp_path / "dump").write_text("x\n")
    rankview.forget_others(str(tmp_path), 4, 2)          # this node: ranks 4 and 5 now
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dump", "rank-4", "rank-5"]


# NCCL's flight recorder, as a CUDA build of torch binds it (torch/csrc/distributed/c10d/init.cpp: `_dump_nccl_trace`
# and `_dump_nccl_trace_json` exist only under USE_C10D_NCCL, so never in this CPU wheel) and as its dump is shaped
# (torch/csrc/distributed/c10d/FlightRecorder.hpp and FlightRecorderDetail.hpp: "version", "nccl_version",
# "pg_config" by group name with name/desc/ranks, "pg_status" by group id with last_enqueued/started/completed
# collective, entries with record_id, pg_id, process_group [name, desc], collective_seq_id, p2p_seq_id, op_id,
# profiling_name "nccl:<op>", time_created_ns, input/output sizes and dtypes, state scheduled|started|completed,
# duration_ms, timeout_ms, is_p2p, retired, frames). A CUDA all_reduce returns at once: a rank that waits in one
# is one whose enqueued collective has not completed (its GPU waits for the peers).
def _nccl_dump(enq: int, done: int, created_ns: int) -> dict:
    entries = [{"record_id": i - 1, "pg_id": 0, "process_group": ["0", "default_pg"], "collective_seq_id": i,
                "p2p_seq_id": 0, "op_id": i, "profiling_name": "nccl:all_reduce", "time_created_ns": created_ns + i,
                "input_sizes": [[1024]], "input_dtypes": ["Float"], "output_sizes": [[1024]],
                "output_dtypes": ["Float"], "state": "completed" if i <= done else "started",
                "time_discovered_started_ns": created_ns + i, "time_discovered_completed_ns": None,
                "retired": i <= done, "timeout_ms": 600000, "is_p2p": False, "duration_ms": None, "frames": []}
               for i in range(1, enq + 1)]
    return {"version": "2.10", "nccl_version": "2.27.5",
            "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1, 2, 3]"}},
            "pg_status": {"0": {"last_enqueued_collective": enq, "last_started_collective": enq,
                                "last_completed_collective": done}},
            "entries": entries}


class _NcclC10d:
    """``torch._C._distributed_c10d`` of a CUDA build: NCCL's recorder (scripted) beside an empty CPU one."""

    def __init__(self):
        self.enq, self.done, self.created_ns, self.calls = 0, 0, time.time_ns() - 30 * 10**9, []

    def _dump_fr_trace_json(self, includeCollectives=True, onlyActive=False):
        return json.dumps({"version": "2.10", "pg_status": {}, "entries": []}).encode()

    def _dump_nccl_trace_json(self, includeCollectives=True, onlyActive=False):
        self.calls.append(("json", includeCollectives))
        d = _nccl_dump(self.enq, self.done, self.created_ns)
        if includeCollectives is False:
            d.pop("entries")
        return json.dumps(d, sort_keys=True).encode()     # nlohmann::json's objects are std::maps: keys sorted

    def _dump_nccl_trace(self, includeCollectives=True, includeStackTraces=True, onlyActive=False):
        import pickle

        self.calls.append(("pickle", includeStackTraces))
        return pickle.dumps(_nccl_dump(self.enq, self.done, self.created_ns))


def test_a_gpu_rank_is_read_from_nccls_flight_recorder_once_it_records_a_group(tmp_path, monkeypatch):
    fake = _NcclC10d()
    monkeypatch.setitem(sys.modules, "torch._C._distributed_c10d", fake)
    monkeypatch.setattr(rankview, "_nccl_seen", False)
    assert rankview._fr() is fake                  # NCCL's records nothing yet (no NCCL group): the CPU one
    fake.enq = fake.done = 3
    assert isinstance(rankview._fr(), rankview.NcclRecorder)
    clock = _Clock()
    m = rankview.Monitor(str(tmp_path), rank=2, local_rank=0, progress=rankview.Progress(clock), clock=clock)
    assert m.tick()["colls"] == 3
    fake.enq = 4                                   # all_reduce #4 launched, its GPU waits for a peer
    for _ in range(3):
        clock.t += 1
        d = m.tick()
    assert d["in"]["op"] == "all_reduce" and d["in"]["seq"] == 4 and d["in"]["for_s"] >= 29
    assert d["state"] == "waiting" and d["colls"] == 3
    assert d["arrivals"][-1] == [4, fake.created_ns + 4]      # completed or not, each arrival (CPU enqueue time)


def test_a_gpu_ranks_dump_is_ncclss_flight_record_which_torchs_analyzer_reads(tmp_path, monkeypatch):
    import pickle

    fake = _NcclC10d()
    fake.enq, fake.done = 5, 4
    monkeypatch.setitem(sys.modules, "torch._C._distributed_c10d", fake)
    monkeypatch.setattr(rankview, "_nccl_seen", False)
    rankview.dump(str(tmp_path / "d"), 2)
    d = pickle.loads((tmp_path / "d" / "fr-2").read_bytes())
    assert ("pickle", False) in fake.calls          # without C++ stack traces (seconds to symbolize)
    assert d["nccl_version"] == "2.27.5" and [e["profiling_name"] for e in d["entries"]] == ["nccl:all_reduce"] * 5
    assert d["pg_config"]["0"]["ranks"] == "[0, 1, 2, 3]"     # NCCL's own config kept: the analyzer's key
    assert (tmp_path / "d" / "stack-2.txt").read_text().startswith("rank 2 pid ")


def test_a_forked_ranks_monitor_looks_at_its_own_main_thread(tmp_path):
    """A warm rank is forked by the zygote: Python keeps the parent's tid as the main thread's native_id in the
    child, so /proc/self/task/<that tid> is not there and the rank never read as running (the soak: a warm rank
    computing at load 50 was still, and a hang)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        m = rankview.Monitor(str(tmp_path), rank=0, local_rank=0, progress=rankview.Progress())
        os.write(w, b"1" if m.main_tid == threading.get_native_id() and m.main_running() else b"0")
        os._exit(0)
    os.waitpid(pid, 0)
    assert os.read(r, 1) == b"1"


def test_the_monitor_never_waits_on_an_import_the_main_thread_has_not_finished(tmp_path):
    """Issue 37 (a hang verdict naming a cold rank "stuck in _lock_unlock_module"): the monitor's thread must never
    take an import lock. A dump asked while the rank's main thread was still importing torch.distributed (a cold
    rank at load 50 imports torch for a minute) ran `from torch.distributed import distributed_c10d` in the
    monitor's thread, which waited on that import's lock (`_lock_unlock_module`) until the import ended: no view
    written meanwhile, no fr-<RANK>. Here this thread holds torch.distributed's import lock, as its import does,
    while the monitor ticks and dumps."""
    import importlib._bootstrap as bootstrap

    import torch.distributed  # noqa: F401 - imported whole; its import is replayed below

    spec = sys.modules["torch.distributed"].__spec__
    lock = bootstrap._get_module_lock("torch.distributed")
    m = rankview.Monitor(str(tmp_path), rank=3, local_rank=0, progress=rankview.Progress())
    done = threading.Event()

    def monitor():
        m.tick()
        rankview.dump(str(tmp_path / "d"), 3)
        done.set()

    t = threading.Thread(target=monitor, daemon=True)
    lock.acquire()
    spec._initializing = True
    try:
        t.start()
        finished = done.wait(10)
    finally:
        spec._initializing = False
        lock.release()
        t.join(30)
    assert finished, "the monitor waited on torch.distributed's import lock"
    assert (tmp_path / "d" / "stack-3.txt").is_file()
    assert "not yet" in (tmp_path / "d" / "fr-3.error").read_text()
    rankview.dump(str(tmp_path / "e"), 3)            # imported now: the flight record
    assert (tmp_path / "e" / "fr-3").is_file()


IMPORT_RACE = r"""
import os, sys, threading
from clusterctl import rankview

view = sys.argv[1]
m = rankview.Monitor(view, rank=0, local_rank=0, progress=rankview.Progress())
bad, looks, dumps = [], [0], [0]


def prof(frame, event, arg):
    if event == "call" and frame.f_code.co_filename.startswith("<frozen importlib"):
        bad.append(f"{frame.f_code.co_name}({frame.f_locals.get('name')})")


class EveryImport:
    # before each module the main thread imports: one tick in another thread (and a dump while torch.distributed
    # is being imported), waited for
    def find_spec(self, name, path=None, target=None):
        if bad or threading.current_thread() is not threading.main_thread():
            return None
        td = sys.modules.get("torch.distributed")
        dumping = td is not None and td.__spec__._initializing and "torch._C._distributed_c10d" in sys.modules

        def look():
            sys.setprofile(prof)
            try:
                m.tick()
                if dumping:
                    rankview.dump(os.path.join(view, f"d{looks[0]}"), 0)
                    dumps[0] += 1
            except Exception as e:
                bad.append(repr(e))
            finally:
                sys.setprofile(None)

        t = threading.Thread(target=look, daemon=True)
        t.start()
        t.join(5)
        looks[0] += 1
        if t.is_alive():
            bad.append(f"blocked before {name}")
        return None


sys.meta_path.insert(0, EveryImport())
import torch, torch.distributed, torch.optim, torch.nn.parallel, torch.utils.data
print(looks[0], dumps[0], bad[:3])
"""


def test_a_tick_or_a_dump_at_any_point_of_a_ranks_import_of_torch_enters_no_import(tmp_path):
    """The monitor's thread runs while the rank's main thread imports torch (a cold rank): before every module of
    that import a tick runs in another thread (a dump too while torch.distributed is being imported, which is when
    torch's flight recorder appears), with a profile on that thread; neither calls into importlib (no import, no
    import lock) nor blocks."""
    r = subprocess.run([sys.executable, "-c", IMPORT_RACE, str(tmp_path)], env=ENV, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    looks, dumps, bad = r.stdout.split(" ", 2)
    assert int(looks) > 500 and int(dumps) > 10, r.stdout        # it looked all along torch's import
    assert bad.strip() == "[]", r.stdout
