"""The rank view: what each rank of a job is doing, written once a second to a small file the node's watch reads.

Shipped to the nodes beside ``checkpoint.py`` (``plan.NODE_MODULES``); stdlib only at import, imports no other
clusterctl module; torch is only used where the rank already imported it (the monitor's thread imports nothing
and never waits on an import lock: a torch module the main thread is still importing is left alone). Every rank
the launcher starts, cold (torchrun's entry) or warm (the zygote's ``rank`` kind), runs through it::

    python -m clusterctl.rankview SCRIPT ARGS...      # as `python SCRIPT ARGS...`
    python -m clusterctl.rankview -m MODULE ARGS...   # as `python -m MODULE ARGS...`

It starts the monitor (below) when ``CLUSTERCTL_VIEW_DIR`` is set, then runs the script exactly as python would:
``sys.argv``, ``sys.path[0]`` (the script's directory; the working directory for ``-m``), ``__main__``; its exit
code, ``SystemExit`` and uncaught exceptions reach the interpreter unchanged (nothing here catches them), so
torchrun's ``@record`` error file and Root Cause summary are the script's own.

The monitor, a daemon thread, writes ``$CLUSTERCTL_VIEW_DIR/rank-<RANK>`` every ``TICK_S`` (temp file + rename):
one line of JSON (``view``): the rank's progress (optimizer steps, counted by a global optimizer step hook, and
the collectives its default process group completed, from torch's flight recorder), whether it waits in a
collective and which, its CPU time and I/O (its own, the monitor's excluded), RSS, where its main thread is and a
hash of that stack, its own state hint, the last collectives' arrival times (every ``ARRIVALS_S``) and the
``/proc`` state of the other local ranks. The flight recorder's status (a few hundred bytes) is read every tick;
its entries (up to ``TORCH_FR_BUFFER_SIZE`` of them) only when the rank waits in a collective and for
``arrivals``.

A file ``$CLUSTERCTL_VIEW_DIR/dump`` asks every rank of the node for its flight-recorder dump and stacks: its
content names a directory (absolute, or relative to the view dir); each rank writes ``fr-<RANK>`` there (the
pickle ``python -m torch.distributed.flight_recorder.fr_trace DIR -p fr-`` reads, gloo's ``pg_config``
rebuilt) and ``stack-<RANK>.txt`` (``faulthandler``, every thread), once per distinct content.
"""
from __future__ import annotations

import ctypes
import faulthandler
import json
import os
import runpy
import sys
import threading
import time
import zlib

VIEW_DIR_VAR = "CLUSTERCTL_VIEW_DIR"
TRIGGER = "dump"
TICK_S = 1.0
ARRIVALS_S = 10.0        # how often the last collectives' arrival times are read (a whole flight-recorder dump)
ARRIVALS = 32            # how many
RECENT_S = 3.0           # progress, CPU, I/O within this: training / busy; none, same stack, for this: still
WAIT_S = 1.0             # in a collective this long: waiting
CPU_EPSILON_S = 0.05     # CPU seconds per RECENT_S below which a rank counts as not computing
FORMAT = 1

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_CLK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


# ------------------------------------------------------------------------------------------------ the wrapper
def run(argv: list[str]) -> None:
    """Run ``argv`` (``SCRIPT ARGS...`` or ``-m MODULE ARGS...``) as python would run it in this interpreter."""
    if not argv or argv[0] in ("-h", "--help") or (argv[0] == "-m" and len(argv) < 2):
        sys.stderr.write("usage: python -m clusterctl.rankview SCRIPT [ARGS...] | -m MODULE [ARGS...]\n")
        raise SystemExit(2)
    if argv[0] == "-m":
        # `python -m X` has the working directory first on sys.path: so has `python -m clusterctl.rankview`
        sys.argv = [argv[1], *argv[2:]]     # runpy puts the module's path in argv[0], as python does
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    else:
        script = argv[0]
        sys.argv = list(argv)
        # `python SCRIPT` has the script's directory (symlinks resolved) first on sys.path, where our own `-m` (or
        # the zygote's) put the working directory; a directory or zip file is put there by runpy itself
        ours = bool(sys.path) and sys.path[0] in ("", os.getcwd())
        if not os.path.exists(script):       # python's own words and exit code (causes.CANT_OPEN: config_error)
            sys.stderr.write(f"{sys.executable}: can't open file {os.path.abspath(script)!r}: "
                             "[Errno 2] No such file or directory\n")
            raise SystemExit(2)
        if not os.path.isfile(script):       # a directory or zip with __main__.py: runpy does what python does
            sys.path[0:1 if ours else 0] = []
            runpy.run_path(script, run_name="__main__")
            return
        sys.path[0:1 if ours else 0] = [os.path.dirname(os.path.realpath(script))]
        run_file(script)


def run_file(script: str) -> None:
    """Execute ``script`` as python's ``python SCRIPT`` does: in a fresh ``__main__`` module (it stays
    ``sys.modules["__main__"]``: pickle and multiprocessing's spawn find the script's classes there), ``__file__``
    its absolute path, ``sys.argv[0]`` as given."""
    import builtins
    import importlib.machinery
    import types

    path = os.path.abspath(script)
    with open(path, "rb") as f:         # python reads it with io.open_code: the same bytes
        source = f.read()
    code = compile(source, path, "exec", dont_inherit=True)
    main = types.ModuleType("__main__")
    main.__dict__.update(__file__=path, __cached__=None, __builtins__=builtins,
                         __loader__=importlib.machinery.SourceFileLoader("__main__", path))
    sys.modules["__main__"] = main
    exec(code, main.__dict__)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    view_dir = os.environ.get(VIEW_DIR_VAR)
    if view_dir and argv and argv[0] not in ("-h", "--help"):
        start(view_dir)
    run(argv)


# ------------------------------------------------------------------------------------------------ progress
class Progress:
    """Optimizer steps of this process: a global step post hook counts them (``torch.optim``'s
    ``register_optimizer_step_post_hook``), installed in the thread that imports ``torch.optim.optimizer`` (so never
    while a step iterates the hooks: never from the monitor's thread), or at once when it is imported already (a
    warm rank: the zygote preloads it)."""

    def __init__(self, clock=time.monotonic):
        self.clock = clock
        self.steps: int | None = None
        self.at = clock()
        self.hooked = False

    def on_step(self, *_args) -> None:
        self.steps = (self.steps or 0) + 1
        self.at = self.clock()

    def hook(self) -> bool:
        mod = sys.modules.get("torch.optim.optimizer")
        register = getattr(mod, "register_optimizer_step_post_hook", None)
        if self.hooked or register is None:
            return self.hooked
        register(self.on_step)          # steps stay None until the first one: a script without an optimizer has
        self.hooked = True              # none (`import torch` imports torch.optim: the hook is always there)
        return True

    def install(self) -> None:
        """Hook now, or right after ``torch.optim.optimizer`` is imported (an import finder, gone once used)."""
        if self.hook():
            return
        sys.meta_path.insert(0, _AfterImport("torch.optim.optimizer", self.hook))


class _AfterImport:
    """A ``sys.meta_path`` finder that runs ``then()`` right after module ``name`` executed, then leaves."""

    def __init__(self, name: str, then):
        self.name, self.then = name, then

    def find_spec(self, fullname, path=None, target=None):
        if fullname != self.name:
            return None
        import importlib.machinery

        try:
            sys.meta_path.remove(self)
        except ValueError:
            pass
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        loader, then = spec.loader, self.then

        class Loader:
            """The module's own loader (every other method and attribute is its: get_source, is_package, ...),
            then ``then()``."""

            def __getattr__(self, name):
                return getattr(loader, name)

            def create_module(self, spec):
                return loader.create_module(spec)

            def exec_module(self, module):
                loader.exec_module(module)
                sys.modules[fullname] = module      # `then` looks it up there (set again by the import system)
                try:
                    then()
                except Exception:  # noqa: BLE001 - a view without steps, never a failed import
                    pass

        spec.loader = Loader()
        return spec


# ------------------------------------------------------------------------------------------------ flight recorder
class NcclRecorder:
    """NCCL's flight recorder under the generic one's names. torch keeps two (torch/csrc/distributed/c10d/init.cpp):
    ``_dump_fr_trace[_json]`` dumps the CPU one (gloo's collectives), ``_dump_nccl_trace[_json]`` NCCL's (CUDA
    collectives; bound only in a build with NCCL: absent from CPU wheels), with the same arguments and the same
    record shape (``pg_status`` per group, entries with ``collective_seq_id``, ``profiling_name`` "nccl:all_reduce",
    ``time_created_ns``, ``state`` scheduled|started|completed)."""

    def __init__(self, c10d):
        self.c10d = c10d

    def _dump_fr_trace_json(self, **kw) -> bytes:
        return self.c10d._dump_nccl_trace_json(**kw)

    def _dump_fr_trace(self, **kw) -> bytes:
        return self.c10d._dump_nccl_trace(**kw)


_nccl_seen = False


def _importing(name: str) -> bool:
    """Is module ``name`` being imported now (in ``sys.modules``, its code still running in another thread: the
    rank's main thread, which holds its import lock)? The monitor then leaves it alone: it never waits on an import
    lock (a cold rank at load 50 takes a minute to import torch) nor calls into a half-built module."""
    return bool(getattr(getattr(sys.modules.get(name), "__spec__", None), "_initializing", False))


def _fr():
    """torch's flight-recorder dumps in this process, or None (no torch imported, an old torch, torch.distributed
    still being imported: no process group yet): NCCL's once it recorded a collective (a GPU job: its default group
    is NCCL's; from then on only NCCL's groups are seen), else the generic one (gloo)."""
    global _nccl_seen
    c10d = sys.modules.get("torch._C._distributed_c10d")
    if c10d is None or _importing("torch.distributed"):
        return None
    if hasattr(c10d, "_dump_nccl_trace_json"):
        if not _nccl_seen:
            _nccl_seen = any(enq > 0 for enq, _ in fr_status(NcclRecorder(c10d)).values())
        if _nccl_seen:
            return NcclRecorder(c10d)
    return c10d if hasattr(c10d, "_dump_fr_trace_json") else None


def fr_status(c10d) -> dict[str, tuple[int, int]]:
    """pg id -> (last enqueued, last completed collective), from a dump without entries (a few hundred bytes)."""
    try:
        d = json.loads(c10d._dump_fr_trace_json(includeCollectives=False))
    except Exception:  # noqa: BLE001 - no process group yet, or a torch that cannot tell
        return {}
    out = {}
    for pg, s in (d.get("pg_status") or {}).items():
        try:
            out[str(pg)] = (int(s["last_enqueued_collective"]), int(s["last_completed_collective"]))
        except (KeyError, TypeError, ValueError):
            continue
    return out


def last_entries(data: bytes, n: int) -> list[dict]:
    """The last ``n`` entries of a flight-recorder JSON dump, parsed alone (a whole dump of 2,000 entries is ~1 MB:
    its entries are objects that each start with ``{"collective_seq_id"``; only the tail is decoded)."""
    key = b'{"collective_seq_id"'
    dec = json.JSONDecoder()
    starts, end = [], len(data)
    while len(starts) < n:
        i = data.rfind(key, 0, end)
        if i < 0:
            break
        starts.append(i)
        end = i
    out = []
    bounds = list(reversed(starts))
    for i, j in zip(bounds, bounds[1:] + [len(data)]):
        try:
            obj, _ = dec.raw_decode(data[i:j].decode("utf-8", "replace"))
        except ValueError:
            continue
        if isinstance(obj, dict):
            out.append(obj)
    return out


def completed_through(entries: list[dict], pg: str, enq: int) -> int | None:
    """The last collective of group ``pg`` completed with every earlier one, from the entries' ``retired`` flags
    (None: the tail does not reach ``enq`` or the torch records no flag). gloo runs collectives on two worker
    threads, each writing ``last_completed_collective`` after its own: under load a thread that finished #4 can
    write it after the other wrote #10, and pg_status then says 4 for as long as no collective follows (a rank
    blocked in its own code read as one waiting in #10)."""
    mine = [e for e in entries if str(e.get("pg_id")) == pg and isinstance(e.get("retired"), bool)
            and isinstance(e.get("collective_seq_id"), int) and e["collective_seq_id"] <= enq]
    if not any(e["collective_seq_id"] == enq for e in mine):
        return None
    open_ = [e["collective_seq_id"] for e in mine if not e["retired"]]
    return min(open_) - 1 if open_ else enq


def waiting_in(status: dict[str, tuple[int, int]], entries: list[dict], now_ns: int) -> dict | None:
    """The collective this rank waits in (enqueued, not completed), preferring the default group "0"."""
    for pg in sorted(status, key=lambda p: (p != "0", p)):
        enq, done = status[pg]
        if enq <= done:
            continue
        for e in reversed(entries):
            if str(e.get("pg_id")) == pg and e.get("collective_seq_id") == enq:
                op = str(e.get("profiling_name") or "")
                created = int(e.get("time_created_ns") or 0)
                return {"pg": pg, "seq": enq, "op": op.split(":", 1)[-1],
                        "for_s": round(max(0.0, (now_ns - created) / 1e9), 1) if created else None}
        return {"pg": pg, "seq": enq, "op": None, "for_s": None}
    return None


def repaired_pickle(c10d) -> bytes:
    """``_dump_fr_trace()`` with its ``pg_config`` rebuilt so torch's analyzer reads it: gloo records it under ""
    (the analyzer's ``KeyError: ('0', 0)``). Each group's ranks from this process's own view of the groups (their
    names, descriptions, global ranks); groups it does not know, from the entries (ranks: the world's)."""
    import pickle           # loaded already (torch imports it): no import lock taken in the monitor's thread

    # no C++ stack traces: symbolizing 2,000 entries' took 1.5-3 s per rank here (30 ms without); each rank's
    # Python stacks are in its stack-<RANK>.txt
    dump = pickle.loads(c10d._dump_fr_trace(includeStackTraces=False))
    config: dict[str, dict] = {}
    try:
        # looked up, never imported: an import here would wait on the import lock of a torch.distributed the main
        # thread is still importing (`_fr` says None then), or import it in the monitor's thread
        world = sys.modules["torch.distributed.distributed_c10d"]._world
        for pg, name in list(world.pg_names.items()):
            ranks = sorted(world.pg_group_ranks.get(pg, {}))
            config[str(name)] = {"name": str(name), "desc": str(getattr(pg, "group_desc", "") or ""),
                                 "ranks": str(ranks)}
    except Exception:  # noqa: BLE001 - rebuilt from the entries alone
        pass
    old = dump.get("pg_config") or {}
    default_ranks = next((v.get("ranks") for v in old.values() if isinstance(v, dict) and v.get("ranks")), None)
    if default_ranks is None and os.environ.get("WORLD_SIZE", "").isdigit():
        default_ranks = str(list(range(int(os.environ["WORLD_SIZE"]))))
    for e in dump.get("entries") or []:
        name, desc = (list(e.get("process_group") or ("", "")) + ["", ""])[:2]
        if name and name not in config:
            config[str(name)] = {"name": str(name), "desc": str(desc), "ranks": default_ranks or "[]"}
    for k, v in old.items():
        if k and k not in config:
            config[k] = v
    dump["pg_config"] = config
    return pickle.dumps(dump)


# ------------------------------------------------------------------------------------------------ NVML
NVML_LIB = "libnvidia-ml.so.1"


class _Utilization(ctypes.Structure):
    _fields_ = [("gpu", ctypes.c_uint), ("memory", ctypes.c_uint)]      # nvmlUtilization_t


class Nvml:
    """A GPU's utilisation (% of the last sample period a kernel ran: nvidia-smi's ``utilization.gpu``) from NVML
    itself through ctypes: ``libnvidia-ml.so.1`` is there wherever nvidia-smi works (the NVIDIA container toolkit
    mounts it into containers), where ``torch.cuda.utilization`` also needs pynvml, which a job's image seldom has.
    The device is named by its PCI bus id, which CUDA_VISIBLE_DEVICES does not renumber. Any failure to load or
    initialise NVML, or to find the device, turns it off for good (None, not asked again)."""

    def __init__(self, lib: str = NVML_LIB):
        self.lib_name = lib
        self.lib = None
        self.handles: dict[str, ctypes.c_void_p] = {}
        self.off = False

    def utilization(self, bus_id: str) -> float | None:
        if self.off:
            return None
        try:
            if self.lib is None:
                lib = ctypes.CDLL(self.lib_name)
                if lib.nvmlInit_v2() != 0:
                    raise OSError("nvmlInit_v2 failed")
                self.lib = lib
            handle = self.handles.get(bus_id)
            if handle is None:
                handle = ctypes.c_void_p()
                if self.lib.nvmlDeviceGetHandleByPciBusId_v2(bus_id.encode(), ctypes.byref(handle)) != 0:
                    raise OSError(f"no NVML device at {bus_id}")
                self.handles[bus_id] = handle
            u = _Utilization()
            if self.lib.nvmlDeviceGetUtilizationRates(handle, ctypes.byref(u)) != 0:
                return None             # this sample only (e.g. GPU lost: the next look tries again)
            return float(u.gpu)
        except (OSError, AttributeError):
            self.off = True
            return None


def pci_bus_id(props) -> str:
    """NVML's bus id ("%08X:%02X:%02X.0", as nvidia-smi prints it) of torch's ``get_device_properties``."""
    return f"{props.pci_domain_id:08X}:{props.pci_bus_id:02X}:{props.pci_device_id:02X}.0"


# ------------------------------------------------------------------------------------------------ the monitor
class Monitor:
    """The view of this rank, one ``tick`` a second (``start`` runs it on a daemon thread)."""

    def __init__(self, view_dir: str, *, rank: int, local_rank: int, progress: Progress,
                 clock=time.monotonic, main_ident: int | None = None, nvml: Nvml | None = None):
        self.dir, self.rank, self.local_rank = view_dir, rank, local_rank
        self.progress, self.clock = progress, clock
        self.path = os.path.join(view_dir, f"rank-{rank}")
        self.tmp = os.path.join(view_dir, f".rank-{rank}.tmp")
        self.main_ident = main_ident if main_ident is not None else threading.main_thread().ident
        self.pid = os.getpid()
        self.start_ticks = _start_ticks()
        self.n = 0
        self.started = clock()
        self.own_io = 0             # bytes this monitor read and wrote (counted in /proc/self/io too)
        self.colls: int | None = None
        self.colls_at = self.started
        # (t, cpu, io, stack, main thread running) over RECENT_S
        self.samples: list[tuple[float, float, int | None, str, bool]] = []
        # the main thread's kernel tid: its own when this runs in it (a forked warm rank's main thread keeps the
        # zygote's native_id in `threading`: Python 3.11 does not update it after fork)
        self.main_tid = threading.get_native_id() if threading.current_thread() is threading.main_thread() \
            else threading.main_thread().native_id
        self.arrivals: list[list[int]] | None = None
        self.arrivals_at: float | None = None
        self.waiting: dict | None = None
        self.waiting_since_ns = 0        # wall clock ns of its arrival in the collective it waits in
        self.in_flight: dict[str, tuple[int, int]] = {}    # pg -> (enqueued, completed) of last tick's collectives
        self.completed: dict[str, tuple[int, int]] = {}    # pg -> (enqueued, completed) as corrected last tick
        self.dumped: str | None = None   # the trigger's content last acted on
        self.peer_pids: dict[str, int] = {}
        self.nvml = nvml if nvml is not None else Nvml()
        self.bus_ids: dict[int, str] = {}

    # -------------------------------------------------------------- /proc
    def _read(self, path: str) -> bytes:
        with open(path, "rb", buffering=0) as f:
            data = f.read(65536)
        self.own_io += len(data)
        return data

    def cpu_s(self) -> float:
        """CPU seconds of this process (less the monitor's own) and of its children (DataLoader workers)."""
        t = os.times()
        cpu = t.user + t.system - time.thread_time()
        try:
            kids = self._read(f"/proc/{self.pid}/task/{self.pid}/children").split()
        except OSError:
            kids = []
        for k in kids[:64]:
            try:
                fields = self._read(f"/proc/{int(k)}/stat").rsplit(b")", 1)[1].split()
                cpu += (int(fields[11]) + int(fields[12])) / _CLK
            except (OSError, ValueError, IndexError):
                continue
        return cpu

    def io(self) -> int | None:
        own = self.own_io                  # what this read adds is counted in the file's next reading, not this one
        try:
            data = self._read("/proc/self/io")
        except OSError:
            return None
        total = 0
        for line in data.splitlines():
            k, _, v = line.partition(b":")
            if k in (b"rchar", b"wchar"):
                total += int(v)
        return total - own

    def rss(self) -> int | None:
        try:
            return int(self._read("/proc/self/statm").split()[1]) * _PAGE
        except (OSError, ValueError, IndexError):
            return None

    def gpu(self) -> tuple[float | None, int | None]:
        """(utilisation %, memory reserved in bytes) of the rank's GPU, once the rank uses CUDA: the caching
        allocator's count (no sync) and NVML's utilisation (``Nvml``: None where NVML is not there)."""
        cuda = sys.modules.get("torch.cuda")
        try:
            if cuda is None or _importing("torch.cuda") or not cuda.is_initialized():
                return None, None
            n = cuda.device_count()
            dev = self.local_rank if n > 1 and self.local_rank < n else 0   # (this thread's current device is 0)
            mem = int(cuda.memory_reserved(dev))
        except Exception:  # noqa: BLE001
            return None, None
        try:
            if dev not in self.bus_ids:
                self.bus_ids[dev] = pci_bus_id(cuda.get_device_properties(dev))
        except Exception:  # noqa: BLE001 - a torch without the PCI ids: no utilisation
            return None, mem
        return self.nvml.utilization(self.bus_ids[dev]), mem

    def main_running(self) -> bool:
        """Is the main thread running or runnable (``R`` in /proc)? A rank that computes is, however little CPU a
        loaded node gives it (the soak: 0.05 CPU-s in 3 s on a node at load 40 read as still, and a hang)."""
        try:
            data = self._read(f"/proc/self/task/{self.main_tid}/stat")
            return data.rsplit(b")", 1)[1].split()[0] == b"R"
        except (OSError, IndexError, TypeError):
            return False

    def peers(self) -> dict[str, str]:
        """The other local ranks' one-letter /proc state (T: stopped), from the node's view files' pids."""
        out = {}
        for pid in list(self.peer_pids.values()):
            try:
                out[str(pid)] = self._read(f"/proc/{pid}/stat").rsplit(b")", 1)[1].split()[0].decode()
            except (OSError, IndexError):
                out[str(pid)] = "-"        # gone (or another PID namespace)
        return out

    def _learn_peers(self) -> None:
        try:
            names = [n for n in os.listdir(self.dir) if n.startswith("rank-") and n != f"rank-{self.rank}"]
        except OSError:
            return
        for name in names:
            if name in self.peer_pids:
                continue
            try:
                pid = json.loads(self._read(os.path.join(self.dir, name))).get("pid")
            except (OSError, ValueError, AttributeError):
                continue
            if isinstance(pid, int):
                self.peer_pids[name] = pid

    # -------------------------------------------------------------- the main thread
    def where(self) -> tuple[str | None, str]:
        frame = sys._current_frames().get(self.main_ident)
        if frame is None:
            return None, "00000000"
        top = f"{frame.f_code.co_filename}:{frame.f_lineno} {frame.f_code.co_name}"
        parts = []
        f = frame
        while f is not None and len(parts) < 200:
            parts.append(f"{f.f_code.co_filename}:{f.f_lineno}:{f.f_code.co_name}")
            f = f.f_back
        return top, f"{zlib.crc32(chr(10).join(parts).encode()):08x}"

    # -------------------------------------------------------------- one tick
    def view(self) -> dict:
        now = self.clock()
        self.n += 1
        c10d = _fr()
        raw = fr_status(c10d) if c10d is not None else {}
        status = self._corrected(raw)
        # in a collective since the last tick at least (the same one enqueued, nothing completed since): only then
        # are the entries read to say which (a rank that trains passes through collectives all the time)
        in_flight = {pg: s for pg, s in status.items() if s[0] > s[1]}
        held = bool(in_flight) and in_flight == self.in_flight
        steps = self.progress.steps
        stalled = steps is None or now - self.progress.at >= WAIT_S
        waiting = held and stalled
        # the same collective as at the last look: its op and arrival are known, only how long grows (a rank that
        # waits a while every step reads the entries once per collective, not once a second)
        known = waiting and self.waiting is not None and self.waiting.get("for_s") is not None and \
            in_flight.get(self.waiting["pg"], (None,))[0] == self.waiting["seq"]
        entries: list[dict] = []
        if c10d is not None and status and ((waiting and not known) or self.arrivals_at is None
                                            or now - self.arrivals_at >= ARRIVALS_S):
            try:
                entries = last_entries(c10d._dump_fr_trace_json(), ARRIVALS)
            except Exception:  # noqa: BLE001
                entries = []
            if entries or self.arrivals_at is None or now - self.arrivals_at >= ARRIVALS_S:
                # (entries read for a wait count as a look at the arrivals too; none yet: look again next tick)
                self.arrivals_at = now if entries else None
                self.arrivals = [[int(e["collective_seq_id"]), int(e["time_created_ns"])] for e in entries
                                 if str(e.get("pg_id")) == "0" and e.get("time_created_ns")]
            if entries:         # what the entries say completed, where pg_status lags (see completed_through)
                for pg, (enq, _) in raw.items():
                    done = completed_through(entries, pg, enq)
                    if done is not None and done > self.completed[pg][1]:
                        self.completed[pg] = (enq, done)
                status = self._corrected(raw)
                in_flight = {pg: s for pg, s in status.items() if s[0] > s[1]}
                waiting = waiting and bool(in_flight)
        self.in_flight = in_flight
        if "0" in status:
            done = status["0"][1]
            if done != self.colls:
                self.colls, self.colls_at = done, now
        now_ns = time.time_ns()
        if known:
            self.waiting = {**self.waiting, "for_s": round((now_ns - self.waiting_since_ns) / 1e9, 1)}
        elif waiting and entries:
            self.waiting = waiting_in(status, entries, now_ns)
            if self.waiting is not None and self.waiting.get("for_s") is not None:
                self.waiting_since_ns = now_ns - int(self.waiting["for_s"] * 1e9)
        elif not waiting:
            self.waiting = None
        where, stack = self.where()
        cpu, io = self.cpu_s(), self.io()
        self.samples = [s for s in self.samples if now - s[0] <= RECENT_S + 0.5] + [
            (now, cpu, io, stack, self.main_running())]
        self._learn_peers()
        progress_at = self.progress.at if steps is not None else self.colls_at
        d = {"v": FORMAT, "n": self.n, "rank": self.rank, "local_rank": self.local_rank, "pid": self.pid,
             "start": self.start_ticks, "hz": _CLK,
             "step": steps, "step_age_s": round(now - self.progress.at, 1),
             "colls": self.colls, "coll_age_s": round(now - self.colls_at, 1),
             "in": self.waiting, "cpu_s": round(cpu, 2), "io": io, "rss": self.rss(),
             "where": where, "stack": stack,
             "state": self.state(now, progress_at, steps is not None or bool(self.colls)),
             "peers": self.peers(), "mon_cpu_s": round(time.thread_time(), 3)}    # this monitor's own CPU
        util, mem = self.gpu()
        if mem is not None:
            d["gpu_util"], d["gpu_mem"] = util, mem
        if self.arrivals is not None:
            d["arrivals"] = self.arrivals
        return d

    def _corrected(self, raw: dict[str, tuple[int, int]]) -> dict[str, tuple[int, int]]:
        """pg_status, its completed never going back (see completed_through) while the group's enqueued does not
        (a group made again starts over)."""
        out = {}
        for pg, (enq, done) in raw.items():
            last = self.completed.get(pg)
            if last is not None and last[0] <= enq:
                done = max(done, last[1])
            out[pg] = self.completed[pg] = (enq, done)
        return out

    def state(self, now: float, progress_at: float, progressed: bool) -> str:
        """training: progress within RECENT_S; waiting: in a collective >= WAIT_S; busy: CPU or I/O within RECENT_S,
        or its main thread seen running (R) then; still: none of those and the same stack for RECENT_S; starting:
        no progress yet (else busy)."""
        if progressed and now - progress_at < RECENT_S:
            return "training"
        if self.waiting is not None and (self.waiting.get("for_s") or 0) >= WAIT_S:
            return "waiting"
        old = [s for s in self.samples if now - s[0] >= RECENT_S - 0.25]
        if old:
            ref, last = old[-1], self.samples[-1]
            window = [s for s in self.samples if s[0] >= ref[0]]
            if last[1] - ref[1] >= CPU_EPSILON_S or (last[2] is not None and ref[2] is not None and last[2] != ref[2]) \
                    or any(s[4] for s in window):
                return "busy"
            if all(s[3] == last[3] for s in window):
                return "still"
        elif self.samples and len(self.samples) > 1:
            first, last = self.samples[0], self.samples[-1]
            if last[1] - first[1] >= CPU_EPSILON_S or any(s[4] for s in self.samples):
                return "busy"
        return "starting" if not progressed else "busy"

    def write(self, d: dict) -> None:
        data = (json.dumps(d, separators=(",", ":")) + "\n").encode()
        fd = os.open(self.tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(fd, data)
        finally:
            os.close(fd)
        self.own_io += len(data)
        os.replace(self.tmp, self.path)

    def check_trigger(self) -> str | None:
        """Act on ``<view dir>/dump`` once per content: the dump's directory, or None."""
        try:
            want = self._read(os.path.join(self.dir, TRIGGER)).decode(errors="replace").strip()
        except OSError:
            return None
        if not want or want == self.dumped:
            return None
        self.dumped = want
        target = want if os.path.isabs(want) else os.path.join(self.dir, want)
        dump(target, self.rank)
        return target

    def tick(self) -> dict:
        self.check_trigger()
        d = self.view()
        self.write(d)
        return d


def _start_ticks() -> int | None:
    """This process's start time (field 22 of /proc/self/stat: clock ticks since boot, the same number in every
    PID namespace): with ``pid``, what lets the node's watch read this rank's CPU time and state from outside
    (``runtimes.WATCH``) and know it is this process."""
    try:
        with open("/proc/self/stat", "rb") as f:
            return int(f.read().rsplit(b")", 1)[1].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def dump(directory: str, rank: int) -> None:
    """``fr-<rank>`` (repaired flight-recorder pickle; not when this process has none) and ``stack-<rank>.txt``."""
    os.makedirs(directory, mode=0o700, exist_ok=True)
    with open(os.path.join(directory, f"stack-{rank}.txt"), "w") as f:
        f.write(f"rank {rank} pid {os.getpid()}\n")
        f.flush()
        faulthandler.dump_traceback(f, all_threads=True)
    c10d = _fr()
    try:
        if c10d is None:
            raise RuntimeError("no flight recorder in this process (torch.distributed not imported, or not yet)")
        data = repaired_pickle(c10d)
    except Exception as e:  # noqa: BLE001 - the stacks are still there
        with open(os.path.join(directory, f"fr-{rank}.error"), "w") as f:
            f.write(f"{type(e).__name__}: {e}\n")
        return
    tmp = os.path.join(directory, f".fr-{rank}.tmp")
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, os.path.join(directory, f"fr-{rank}"))


def _loop(mon: Monitor) -> None:
    while True:
        t = time.monotonic()
        try:
            mon.tick()
        except Exception:  # noqa: BLE001 - a view that fails once is written again next tick
            pass
        time.sleep(max(0.05, TICK_S - (time.monotonic() - t)))


def forget_others(view_dir: str, first: int, local_world: int) -> None:
    """Remove the view files of ranks that are not this node's now (torchrun gives a node the ranks ``first`` ..
    ``first + local_world - 1``): after torchrun restarted its workers with other ranks (a re-rendezvous within the
    attempt), a file of a rank gone from the node would read as a rank that stopped answering."""
    try:
        names = os.listdir(view_dir)
    except OSError:
        return
    for name in names:
        n = name[5:] if name.startswith("rank-") else ""
        if n.isdigit() and not first <= int(n) < first + local_world:
            try:
                os.unlink(os.path.join(view_dir, name))
            except OSError:
                pass


def start(view_dir: str) -> Monitor | None:
    """Start this rank's monitor (a daemon thread); None when the view dir cannot be written."""
    try:
        rank = int(os.environ.get("RANK", "0"))
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    except ValueError:
        return None
    if not os.path.isdir(view_dir) or not os.access(view_dir, os.W_OK | os.X_OK):
        return None
    if local_rank == 0:
        forget_others(view_dir, rank, int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1))
    progress = Progress()
    progress.install()
    mon = Monitor(view_dir, rank=rank, local_rank=local_rank, progress=progress)
    threading.Thread(target=_loop, args=(mon,), name="clusterctl-rankview", daemon=True).start()
    return mon


if __name__ == "__main__":
    main()
