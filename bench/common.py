"""What the benchmark scripts share: the repository paths, the standard options of a script that brings up its own
testbed, teardown on SIGTERM/SIGHUP, and the one-line description of the machine a number was measured on.

Run a script as ``python bench/NAME.py``: its folder is then on ``sys.path`` and ``import common`` puts the
repository root there too (for ``clusterctl`` and ``tests.testbed``).
"""
from __future__ import annotations

import argparse
import atexit
import os
import platform
import resource
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "benchmarks.md"
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def scratch(prefix: str) -> Path:
    """A fresh dir under the temp dir for a bench's testbed and jobs. Removed at exit, unless an uncaught exception
    ended the bench: then its jobs' state and logs stay for a look (the path is printed)."""
    base = Path(tempfile.mkdtemp(prefix=prefix))

    def clean() -> None:
        if hasattr(sys, "last_value"):      # set by the interpreter when an exception ended it
            print(f"kept {base}: the failed run's testbed files and its jobs' state and logs", file=sys.stderr)
        else:
            shutil.rmtree(base, ignore_errors=True)
    atexit.register(clean)
    return base


def options(description: str, *, reps: int | None = None, prog: str | None = None) -> argparse.ArgumentParser:
    """An ArgumentParser with ``--no-write`` and, with its default given, ``--reps`` (a script without a testbed
    of its own; ``parser`` adds the testbed's options)."""
    ap = argparse.ArgumentParser(description=description, prog=prog)
    ap.add_argument("--no-write", action="store_true", help="print only; leave docs/benchmarks.md alone")
    if reps is not None:
        ap.add_argument("--reps", type=int, default=reps, help="repetitions per cell")
    return ap


def parser(description: str, *, prefix: str, subnet: int, sizes: str | None = None,
           reps: int | None = None, prog: str | None = None) -> argparse.ArgumentParser:
    """An ArgumentParser with ``--prefix``/``--subnet`` (the script's own testbed: names and 10.<subnet>.0.0/24,
    distinct per script so two benchmarks never share one), ``--no-write``, and with their defaults given,
    ``--sizes`` (comma-separated host counts: see ``sizes_of``) and ``--reps``."""
    ap = options(description, reps=reps, prog=prog)
    ap.add_argument("--prefix", default=prefix, help="testbed name prefix")
    ap.add_argument("--subnet", type=int, default=subnet, help="testbed subnet 10.N.0.0/24")
    if sizes is not None:
        ap.add_argument("--sizes", default=sizes, help="host counts, comma-separated")
    return ap


def sizes_of(args: argparse.Namespace) -> list[int]:
    return [int(s) for s in args.sizes.split(",") if s]


def cpu_s(who: int) -> float:
    """User + system CPU seconds of ``resource.RUSAGE_SELF`` or ``RUSAGE_CHILDREN``."""
    r = resource.getrusage(who)
    return r.ru_utime + r.ru_stime


def ssh_argv(tb, address: str, argv: list[str], *, known_hosts: str | None = None, kex: str | None = None,
             connect_timeout: float = 30) -> list[str]:
    """An OpenSSH client command to the testbed host at ``address``: no config, batch mode, host keys checked."""
    return ["ssh", "-F", "/dev/null", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes",
            "-o", f"UserKnownHostsFile={known_hosts or tb.known_hosts}", "-o", "IdentitiesOnly=yes",
            "-o", f"ConnectTimeout={connect_timeout:g}", *(["-o", f"KexAlgorithms={kex}"] if kex else []),
            "-i", str(tb.key), f"{tb.user}@{address}", shlex.join(argv)]


def parallel(cmds: list[list[str]], timeout: float = 120) -> tuple[float, float, list[tuple[int, bytes]]]:
    """Start every command at once, wait for all: (wall s, CPU s of this process and its children, [(exit code,
    stdout)])."""
    s0, c0, t0 = cpu_s(resource.RUSAGE_SELF), cpu_s(resource.RUSAGE_CHILDREN), time.perf_counter()
    procs = [subprocess.Popen(c, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
             for c in cmds]
    outs = [p.communicate(timeout=timeout)[0] for p in procs]
    wall = time.perf_counter() - t0
    cpu = (cpu_s(resource.RUSAGE_CHILDREN) - c0) + (cpu_s(resource.RUSAGE_SELF) - s0)
    return wall, cpu, [(p.returncode, o) for p, o in zip(procs, outs)]


def publish(heading: str, text: str, *, write: bool) -> None:
    """Print the section ``text``; with ``write`` (no ``--no-write``) also put it into docs/benchmarks.md in place
    of the section under ``heading`` (other sections are left alone)."""
    from docsection import write_section

    print(text)
    if write:
        write_section(heading, text, DOC)
        print(f"wrote {heading} into {DOC}", file=sys.stderr)


def exit_on_signals() -> None:
    """SIGTERM/SIGHUP -> SystemExit, so the script's ``finally`` tears its testbed down."""
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, lambda s, f: sys.exit(128 + s))


def cpu_model() -> str:
    try:
        return next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                     if ln.startswith("model name")), "")
    except OSError:
        return ""


def machine(sharing: str, *, load: bool = False) -> str:
    """Cores, CPU model, OS, Python, paramiko and OpenSSH versions; ``load``: the load average now; ``sharing``:
    what runs on the same cores (``"sshd and clients"``)."""
    import paramiko

    ssh_v = subprocess.run(["ssh", "-V"], capture_output=True, text=True).stderr.strip()
    avg = f"load average {os.getloadavg()[0]:.1f} at the start, " if load else ""
    return (f"{os.cpu_count()} cores ({cpu_model() or platform.machine()}), {avg}{platform.system()} "
            f"{platform.release()}, Python {platform.python_version()}, paramiko {paramiko.__version__}, {ssh_v}; "
            f"{sharing} share the same cores")
