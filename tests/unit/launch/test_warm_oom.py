"""Issue 34 item 9: a warm rank (forked by the zygote, in the zygote's container or host session) that the OOM killer
ended is reported as OOM, as a cold one is. The zygote compares its memory cgroup's OOM kill count at the rank's
fork and at its death (``zygote.oom_kills``); its client says so in the rank's log (``OOM_NOTE``) before it dies of
the signal; the supervisor reads that note (``causes.warm_oom``) where the attempt container's OOMKilled flag or a
kernel log naming the client's pid says nothing. The real OOM kill: tests/integration/test_warm.py."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from clusterctl.config.inventory import Host
from clusterctl.config.spec import loads_job
from clusterctl.launch import zygote
from clusterctl.launch.runtimes import Instance
from clusterctl.model import causes
from clusterctl.store.logcopy import LogSink
from clusterctl.supervise.cluster_ops import ClusterOps
from clusterctl.supervise.probe import ended
from clusterctl.transport.base import CommandResult
from tests.unit.supervise.test_cluster_ops import JOB, Mux, Store

FIX = Path(__file__).resolve().parents[2] / "fixtures" / "causes"

# the zygote with its OOM counter read from a file the test writes (a real OOM kill needs a memory cgroup limit)
SERVE = ("import importlib.util, sys\n"
         "spec = importlib.util.spec_from_file_location('zygote', sys.argv[1])\n"
         "z = importlib.util.module_from_spec(spec)\n"
         "spec.loader.exec_module(z)\n"
         "z.oom_kills = lambda: int(open(sys.argv[3]).read())\n"
         "z.serve(sys.argv[2], ())\n")


def test_the_client_of_a_rank_sigkilled_while_its_cgroup_counted_an_oom_kill_says_so_and_dies_of_sigkill(tmp_path):
    counter = tmp_path / "oom_kill"
    counter.write_text("3")
    path = str(tmp_path / "z.sock")
    z = subprocess.Popen([sys.executable, "-c", SERVE, zygote.__file__, path, str(counter)], stdout=subprocess.PIPE,
                         text=True)
    try:
        assert z.stdout.readline().strip() == zygote.READY
        script = tmp_path / "r.py"
        script.write_text("import os, time\nprint(os.getpid(), flush=True)\ntime.sleep(60)\n")

        def rank_killed(oom: bool) -> subprocess.CompletedProcess:
            p = subprocess.Popen([sys.executable, "-S", zygote.__file__, "client", path, "rank", str(script)],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            pid = int(p.stdout.readline())
            if oom:
                counter.write_text(str(int(counter.read_text()) + 1))
            os.kill(pid, signal.SIGKILL)
            out, err = p.communicate(timeout=20)
            return subprocess.CompletedProcess(p.args, p.returncode, out, err)

        r = rank_killed(oom=True)
        assert r.returncode == -signal.SIGKILL and zygote.OOM_NOTE in r.stderr, r.stderr
        assert "Traceback" not in r.stderr
        r = rank_killed(oom=False)      # SIGKILLed by someone else: the count did not move
        assert r.returncode == -signal.SIGKILL and r.stderr == "", r.stderr
    finally:
        z.terminate()
        z.wait(10)


def test_oom_kills_reads_the_processs_memory_cgroup_v1_v2_and_a_containers_own_at_the_root(tmp_path):
    def tree(proc: str, files: dict[str, str]) -> tuple[str, str]:
        root = tmp_path / str(len(list(tmp_path.iterdir())))
        root.mkdir()
        for name, text in files.items():
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            (root / name).write_text(text)
        (root / "cgroup").write_text(proc)
        return str(root / "cgroup"), str(root / "sys")

    v1 = "oom_kill_disable 0\nunder_oom 0\noom_kill 4\n"
    hybrid = "9:name=systemd:/\n4:memory:/user.slice/s1\n0::/\n"
    assert zygote.oom_kills(*tree(hybrid, {"sys/memory/user.slice/s1/memory.oom_control": v1})) == 4     # bare
    assert zygote.oom_kills(*tree("4:memory:/libpod_parent/libpod-ab\n", {"sys/memory/memory.oom_control": v1})) == 4
    v2 = "low 0\nhigh 0\nmax 9\noom 2\noom_kill 2\noom_group_kill 0\n"
    assert zygote.oom_kills(*tree("0::/system.slice/x.scope\n", {"sys/system.slice/x.scope/memory.events": v2})) == 2
    assert zygote.oom_kills(*tree("0::/\n", {"sys/memory.events": v2})) == 2                       # cgroupns
    assert zygote.oom_kills(*tree("0::/\n", {})) is None                  # the host's root cgroup: none counted
    assert zygote.oom_kills(str(tmp_path / "no-such-file"), str(tmp_path)) is None


def test_the_zygotes_note_is_the_supervisors_oom_evidence():
    assert zygote.OOM_NOTE == causes.WARM_OOM
    lines = causes.node_lines(f"[0]:step 3\n[1]:{zygote.OOM_NOTE}: its memory cgroup counted ...\n", "n1")
    assert causes.warm_oom(lines, "n1", 1) and causes.warm_oom(lines, "n1", None)
    assert not causes.warm_oom(lines, "n1", 0) and not causes.warm_oom(lines, "n2", 1)


def test_a_warm_rank_killed_by_the_oom_killer_is_observed_as_oom_though_the_container_flag_is_false(tmp_path):
    log = (FIX / "torchrun_sigkill.txt").read_text().replace(
        "[1]:step 30 loss 0.4\n", f"[1]:step 30 loss 0.4\n[1]:{zygote.OOM_NOTE}: its memory cgroup counted an OOM "
                                  "kill while it ran (pid 41 in the zygote's namespace)\n")

    class Node:
        def __init__(self, log):
            self.log = log

        def run(self, argv, *, timeout, stdin=None) -> CommandResult:
            text = " ".join(argv)
            out = ("oomkilled=false" if "OOMKilled" in text else self.log if "logs" in text else "")
            return CommandResult(tuple(argv), 0, out, "", 0.01)

        def close(self):
            pass

    hosts = {"n1": Host("n1", "10.0.0.1", runtime="podman", gpus=0)}
    for text, oom in ((log, True), ((FIX / "torchrun_sigkill.txt").read_text(), False)):
        ops = ClusterOps(spec=loads_job(JOB, "job.yaml"), hosts=hosts, job_id="j-1", store=Store(),
                         sink=LogSink(tmp_path / "o.log"), connect=lambda h, o, t=text: Node(t), mux=Mux)
        try:
            o = ended(ops, "n1", 2, Instance("c", "exited", 1), False)
        finally:
            ops.close()
        assert (o.signal, o.rank, o.oom) == ("SIGKILL", 1, oom), o


def test_a_cold_rank_killed_by_its_containers_oom_killer_is_read_from_the_kernel_line():
    """podman sets OOMKilled only when the container's main process was killed, never for a rank under torchrun:
    the kernel's summary line (Linux mm/oom_kill.c, dump_oom_summary) names the victim's memory cgroup, whose path
    holds the container's id; the argv asks for both."""
    from clusterctl.launch import runtimes

    cid = "891b629e6cbe43da8e811636ab107f506334b62d6a7582bda2f5aeb567f8a615"
    kernel = (f"[13921.100159] oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=libpod-{cid},mems_allowed=0,"
              f"oom_memcg=/libpod_parent/libpod-{cid},task_memcg=/libpod_parent/libpod-{cid},task=python,pid=13073,"
              "uid=0\n")
    for name in ("podman", "docker"):
        rt = runtimes.get(name)
        argv = rt.oom_argv(runtimes.Ref("clusterctl-j_n1", "", None, "j"))
        assert "OOMKilled" in argv[2] and "dmesg" in argv[2] and 'grep -F "$cid"' in argv[2]
        assert rt.oom_killed("oomkilled=false\n" + kernel, None)
        assert rt.oom_killed("oomkilled=true\n", None)
        assert not rt.oom_killed("oomkilled=false\n", None)
