"""Pure: (spec, hosts, attempt, ...) -> LaunchPlan, printable for ``--dry-run``.

Secret values are never in a plan: ``NodePlan.env`` maps every secret name to ``***``. The launcher reads the values
(``read_secrets``) and passes ``node.env_script(secrets)`` as the stdin of ``node.runtime_argv`` (see runtimes/).
"""
from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, replace
from typing import Any, Iterable, Mapping

from clusterctl.config import hostport
from clusterctl.config.ids import JOB_ID_RE
from clusterctl.config.inventory import Host
from clusterctl.config.spec import JobSpec, too_few_gpus, visible_gpus
from clusterctl.errors import UserError
from clusterctl.launch import runtimes

MASK = "***"


@dataclass(frozen=True)
class NodePlan:
    host: str                             # inventory name
    address: str
    runtime: str                          # docker | podman | bare
    container_name: str                   # clusterctl-<job_id>_<host> (bare: recorded in node_dir/name)
    runtime_argv: tuple[str, ...]         # full argv to run on the node; stdin = env_script(secrets)
    torchrun_argv: tuple[str, ...]
    env: Mapping[str, str]                # job environment; secrets as ***
    secret_names: tuple[str, ...]
    node_dir: str                         # ~/.clusterctl/nodes/<node>/jobs/<job_id>/<attempt> (bare: node.log, pid, exit, name)
    log_path: str | None                  # bare: node_dir/node.log; containers: None (use runtime logs)
    nproc: int
    is_rdzv_host: bool
    job_id: str = ""                      # the job id its containers are labelled with (not in to_dict: the plan has it)
    # warm recovery (docker, podman; recovery: warm): not in to_dict/render (the first attempt runs runtime_argv)
    warm_dir: str = ""                    # the node's warm key (runtimes.warm_key: its dir in the warm root); "": none
    warm_argv: tuple[str, ...] = ()       # runtime_argv, torchrun and its ranks forked by the zygote
    zygote_argv: tuple[str, ...] = ()     # starts the node's zygote container (stdin: zygote.py)
    cold_why: str = ""                    # why this node has no warm path ("" when it has one)
    infiniband: bool = False              # its containers get the InfiniBand devices (NCCL should not use sockets)

    def env_script(self, secrets: Mapping[str, str], prelude: str = "") -> bytes:
        """The stdin for ``runtime_argv``: ``export NAME='value'`` lines with the real secret values filled in,
        then ``prelude`` (fixed shell text of ours, e.g. ``checkpoint_installer``)."""
        missing = [n for n in self.secret_names if n not in secrets]
        if missing:
            raise UserError(f"secret_env {', '.join(missing)} not set in the environment of clusterctl")
        lines = ["# clusterctl job environment (sourced by eval; never stored)"]
        for k, v in self.env.items():
            value = secrets[k] if k in self.secret_names else v
            lines.append(f"export {k}={shlex.quote(value)}")
        return ("\n".join(lines) + "\n" + prelude).encode()

    def to_dict(self) -> dict[str, Any]:
        return {
            "host": self.host, "address": self.address, "runtime": self.runtime,
            "container_name": self.container_name, "runtime_argv": list(self.runtime_argv),
            "torchrun_argv": list(self.torchrun_argv), "env": dict(self.env),
            "secret_names": list(self.secret_names), "node_dir": self.node_dir, "log_path": self.log_path,
            "nproc": self.nproc, "is_rdzv_host": self.is_rdzv_host,
        }


@dataclass(frozen=True)
class LaunchPlan:
    job: str
    job_id: str
    attempt: int
    rdzv_endpoint: str
    nodes: tuple[NodePlan, ...]
    nnodes: str = ""                      # "MIN:MAX" as given to torchrun
    image: str = ""
    spares: tuple[str, ...] = ()          # the job's hosts beyond nodes' MAX: used when a node is lost
    excluded: tuple[tuple[str, str], ...] = ()   # (host, why): cordoned hosts left out
    notify: tuple[str, ...] = ()          # notify targets, described with webhook URLs as ***

    def node(self, host: str) -> NodePlan:
        for n in self.nodes:
            if n.host == host:
                return n
        raise KeyError(host)

    def to_dict(self) -> dict[str, Any]:
        return {"job": self.job, "job_id": self.job_id, "attempt": self.attempt,
                "rdzv_endpoint": self.rdzv_endpoint, "nnodes": self.nnodes, "image": self.image,
                "nodes": [n.to_dict() for n in self.nodes], "spares": list(self.spares),
                "excluded": [{"host": h, "reason": why} for h, why in self.excluded], "notify": list(self.notify)}

    def render(self) -> str:
        image = any(runtimes.containerized(n.runtime) for n in self.nodes)     # bare runs no image
        out = [f"job {self.job}  id {self.job_id}  attempt {self.attempt}",
               f"rendezvous {self.rdzv_endpoint}  nodes {self.nnodes}" + (f"  image {self.image}" if image else "")]
        if self.spares:
            out.append(f"spares     {', '.join(self.spares)} (beyond nodes' MAX: used in place of a lost node)")
        for host, why in self.excluded:
            out.append(f"excluded   {host}: cordoned: {why}")
        for target in self.notify:
            out.append(f"notify     {target}")
        out.append("")
        for n in self.nodes:
            host_mark = "  (rendezvous host)" if n.is_rdzv_host else ""
            out.append(f"[{n.host}] {n.address}  runtime {n.runtime}  {n.nproc} proc(s){host_mark}")
            if runtimes.containerized(n.runtime):
                out.append(f"  name     {n.container_name}")
            out.append(f"  dir      {n.node_dir}")
            if n.log_path:
                out.append(f"  log      {n.log_path}")
            out.append(f"  torchrun {shlex.join(n.torchrun_argv)}")
            out.append("  env")
            out += [f"    {k}={shlex.quote(v) if v != MASK else MASK}" for k, v in n.env.items()]
            # the exact argv, multi-line wrapper scripts included (the env file and its mount are in there);
            # not indented, so what is shown can be pasted as is
            out.append(f"  command  {shlex.join(n.runtime_argv)}")
            out.append("")
        return "\n".join(out)


_EOF = "__CLUSTERCTL_CHECKPOINT_PY__"
# bare nodes: the runner sets it to NODE_DIR/lib and removes that directory when torchrun ends (containers: the
# temp dir goes with the container)
LIB_DIR_VAR = runtimes.LIB_DIR_VAR


# the modules of ours a training script may import on a node: `from clusterctl import checkpoint, sampler`; and
# rankview.py, which every rank runs through (``torchrun_argv``)
NODE_MODULES = ("checkpoint.py", "sampler.py", "rankview.py")
RANKVIEW = ("-m", "clusterctl.rankview")
# a torchrun command with one of these does not run the entry as `python ENTRY` (torchrun's own -m/--module, its
# --no-python, --run-path): the entry is left as the job gives it (no rank view)
_NOT_PYTHON_ENTRY = ("--no-python", "--no_python", "--run-path", "--run_path", "--module")


def wraps_entry(torchrun: list[str] | tuple[str, ...]) -> bool:
    """Do the ranks of a job with this ``torchrun`` command run through ``clusterctl.rankview``? Yes unless the
    command itself changes how torchrun runs the entry (``-m`` counts only as torchrun's, not python's own
    ``python -m torch.distributed.run``)."""
    for i, a in enumerate(torchrun):
        if a in _NOT_PYTHON_ENTRY or a.startswith(tuple(f"{f}=" for f in _NOT_PYTHON_ENTRY)):
            return False
        if a == "-m" and (i + 1 >= len(torchrun) or torchrun[i + 1] != "torch.distributed.run"):
            return False
    return True


def checkpoint_installer(source: str, extra: Mapping[str, str] | None = None) -> str:
    """Shell text that makes ``from clusterctl import checkpoint`` work wherever the job runs (inside the
    container too): writes ``source`` (checkpoint.py), and each ``extra`` file (name -> text, e.g. sampler.py)
    beside it, into ``$CLUSTERCTL_LIB_DIR`` (bare: set by the runner, removed when torchrun ends) or a fresh
    private temp dir (containers) and prepends it to PYTHONPATH.
    Runs in the shell that execs torchrun, so it needs nothing on the node but ``sh`` and ``mktemp``."""
    files = {"checkpoint.py": source, **(extra or {})}
    v = LIB_DIR_VAR   # its only variable: a CLUSTERCTL_ name, which no job env var may have (any job name arrives)
    parts = []
    for name, text in files.items():
        if _EOF in text:
            raise ValueError(f"{name} contains the heredoc delimiter")
        if not re.fullmatch(r"[a-z_]+\.py", name):
            raise ValueError(f"not a module file name: {name!r}")
        parts.append(f'cat >"${v}/clusterctl/{name}" <<\'{_EOF}\' &&\n{text}'
                     + ("" if text.endswith("\n") else "\n") + f"{_EOF}\n")
    return (f'{{ [ -n "${{{v}:-}}" ] && mkdir -p -m 700 "${v}" || '
            f'{v}=$(mktemp -d "${{TMPDIR:-/tmp}}/clusterctl-lib.XXXXXX"); }} && mkdir -p "${v}/clusterctl" && '
            f': >"${v}/clusterctl/__init__.py" &&\n' + "".join(parts)
            + f'export PYTHONPATH="${v}${{PYTHONPATH:+:$PYTHONPATH}}"\nunset {v}\n'
            # the flight recorder's dump dir (node_env), made before torchrun starts
            + '[ -z "${TORCH_FR_DUMP_TEMP_FILE:-}" ] || mkdir -p -- "${TORCH_FR_DUMP_TEMP_FILE%/*}" 2>/dev/null || :\n')


def read_secrets(names: Iterable[str], environ: Mapping[str, str]) -> dict[str, str]:
    """The values of ``secret_env`` from the controller's environment (``UserError`` naming the missing ones)."""
    names = list(names)
    missing = [n for n in names if n not in environ]
    if missing:
        raise UserError(f"secret_env {', '.join(missing)} not set in the environment of clusterctl")
    return {n: environ[n] for n in names}


def _nproc(spec: JobSpec, host: Host) -> int:
    if spec.nproc_per_node != "gpu":
        return int(spec.nproc_per_node)
    if not host.gpus:
        raise UserError(f"{host.name}: nproc_per_node is \"gpu\" but the host has no known GPUs "
                        "(set clusterctl_gpus in the inventory, or a number in the job)")
    devices = visible_gpus(spec.env)
    if devices is not None and len(devices) < host.gpus:
        raise UserError(f"{host.name}: " + too_few_gpus(spec.env["CUDA_VISIBLE_DEVICES"], len(devices), host.gpus,
                                                        "nproc_per_node: gpu (clusterctl_gpus)"))
    return host.gpus


def nnodes(spec: JobSpec, attempt: int, n_hosts: int) -> str:
    """torchrun's ``--nnodes``: ``MIN:MAX``, but ``MIN:K`` for a relaunch on K < MAX nodes.

    The supervisor, not torchrun, decides which nodes an attempt runs on. A relaunch without a lost node that
    still said ``MIN:MAX`` would make the rendezvous wait ``last_call_timeout`` for nodes that are gone; with
    ``MIN:K`` it closes as soon as the K nodes started have joined.
    """
    top = n_hosts if attempt > 1 and n_hosts < spec.max_nodes else spec.max_nodes
    return f"{spec.min_nodes}:{top}"


def torchrun_argv(spec: JobSpec, *, rdzv_endpoint: str, rdzv_id: str, is_host: bool, local_addr: str,
                  nproc: int, nnodes_arg: str | None = None, warm_dir: str = "") -> list[str]:
    """The torchrun command line of one node (FACTS §2: c10d, is_host on one node, --local-addr everywhere).

    ``warm_dir``: torchrun itself and each rank are forked by the node's zygote: the zygote's client runs
    torchrun's arguments, and the ranks' entrypoint (``--no-python``) is the client again (kind ``rank``).
    The entry (script or ``-m MODULE``) is run by ``clusterctl.rankview`` (``wraps_entry``), cold and warm alike."""
    r = spec.rendezvous
    conf = (f"is_host={1 if is_host else 0},join_timeout={r.join_timeout},last_call_timeout={r.last_call_timeout},"
            f"close_timeout={r.close_timeout},keep_alive_interval={r.keep_alive_interval},"
            f"keep_alive_max_attempt={r.keep_alive_max_attempt},read_timeout={r.read_timeout}")
    argv = [*spec.torchrun,
            f"--nnodes={nnodes_arg or f'{spec.min_nodes}:{spec.max_nodes}'}", f"--nproc-per-node={nproc}",
            "--rdzv-backend=c10d", f"--rdzv-endpoint={rdzv_endpoint}", f"--rdzv-id={rdzv_id}",
            f"--rdzv-conf={conf}", f"--local-addr={local_addr}", f"--max-restarts={spec.restarts.max_restarts}",
            "--tee=3"]  # with TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE every line carries its global rank
    if warm_dir:
        argv = [*runtimes.zygote_client(warm_dir, "torchrun"), *argv[len(spec.torchrun):],
                "--no-python", *runtimes.zygote_client(warm_dir, "rank")]
    entry = ["-m", spec.module] if spec.module is not None else [spec.script]
    if wraps_entry(spec.torchrun):    # every rank runs through the rank view (clusterctl/rankview.py): torchrun's
        entry = [*RANKVIEW, *entry]   # `-m clusterctl.rankview SCRIPT|-m MODULE`; warm: the zygote's rank kind
    return argv + entry + list(spec.args)


# torch's flight recorder (torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp; docs.pytorch.org "PYTORCH
# ProcessGroupNCCL Environment Variables", and the Flight Recorder tutorial): a ring buffer of the last collectives,
# dumped by NCCL's watchdog when a collective times out (DUMP_ON_TIMEOUT needs a buffer size > 0). The file prefix
# (TORCH_FR_DUMP_TEMP_FILE, torch's default /tmp/nccl_trace_rank_) is set where the job has a checkpoint dir.
# torch < 2.7 reads TORCH_NCCL_TRACE_BUFFER_SIZE / TORCH_NCCL_DEBUG_INFO_TEMP_FILE instead (set them in `env:`).
FLIGHT_RECORDER = {"TORCH_FR_BUFFER_SIZE": "2000", "TORCH_NCCL_DUMP_ON_TIMEOUT": "1"}

# Containers: torch.compile's caches (Inductor's, Triton's) on a named volume per node and job name, mounted into
# every container of the job (docker and podman create it on first use; it outlives the containers), so a cold
# relaunch does not compile again. Bare runs on the host, where the defaults (/tmp/torchinductor_<user>,
# ~/.triton/cache) already outlive the processes.
CACHE_DIR = "/var/cache/clusterctl"
COMPILE_CACHES = {"TORCHINDUCTOR_CACHE_DIR": f"{CACHE_DIR}/inductor", "TRITON_CACHE_DIR": f"{CACHE_DIR}/triton"}


def cache_volume(job: str) -> str:
    """The node's named volume that holds the compile caches of the jobs called ``job``."""
    return f"clusterctl-cache-{job}:{CACHE_DIR}"


def node_env(spec: JobSpec, host: Host, *, job_id: str, attempt: int, interface: str | None,
             resume_from: str, resume_step: int, pkg_path: str | None, secret_names: Iterable[str],
             infiniband: bool = False, containerized: bool = False) -> dict[str, str]:
    env: dict[str, str] = {
        "CLUSTERCTL_JOB": spec.name,
        "CLUSTERCTL_JOB_ID": job_id,
        "CLUSTERCTL_ATTEMPT": str(attempt),
        "CLUSTERCTL_NODE": host.name,
        "CLUSTERCTL_CHECKPOINT_DIR": spec.checkpoint.dir or "",
        "CLUSTERCTL_CHECKPOINT_KEEP": str(spec.checkpoint.keep),
        "CLUSTERCTL_CHECKPOINT_VERIFY": spec.checkpoint.verify,
        "CLUSTERCTL_RESUME_FROM": resume_from,
        "CLUSTERCTL_RESUME_STEP": str(resume_step),
        "CLUSTERCTL_COLLECTIVE_TIMEOUT_S": str(spec.supervisor.collective_timeout_s),
        "PYTHONUNBUFFERED": "1",
        "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE": "[${rank}]:",
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",     # GPU indexes as nvidia-smi numbers them (CUDA's default: fastest first)
    }
    if containerized:
        env.update(COMPILE_CACHES)
    if spec.checkpoint.dir:    # flight recorder: NCCL's watchdog dumps every rank's record into one dir on a timeout
        env.update(FLIGHT_RECORDER)
        env["TORCH_FR_DUMP_TEMP_FILE"] = f"{spec.checkpoint.dir}/flight_recorder/{job_id}-{attempt}/rank_"
    if interface:
        env["GLOO_SOCKET_IFNAME"] = interface
        env["NCCL_SOCKET_IFNAME"] = f"={interface}"   # "=": exactly this NIC (without it, a prefix: eth1 -> eth10)
    user_pythonpath = spec.env.get("PYTHONPATH")
    env.update(spec.env)                                  # the job may override NIC vars and PYTHONUNBUFFERED
    if infiniband and "NCCL_DEBUG" not in spec.env:       # NCCL says which network it chose (a handful of lines
        env["NCCL_DEBUG"] = "INFO"                        # per rank): a fall back to sockets is then an event
        env.setdefault("NCCL_DEBUG_SUBSYS", "INIT,NET")
    if pkg_path:
        env["PYTHONPATH"] = f"{pkg_path}:{user_pythonpath}" if user_pythonpath else pkg_path
    for name in secret_names:
        env[name] = MASK
    return env


def infiniband_on(host: Host, found: bool | None) -> bool:
    """Does ``host`` use InfiniBand? Its ``clusterctl_infiniband`` (true/false), else (auto) whether the node has
    /dev/infiniband/uverbs* (``found``; unknown: no)."""
    return host.infiniband if host.infiniband is not None else bool(found)


def container_ulimits(spec: JobSpec, infiniband: bool) -> tuple[tuple[str, str], ...]:
    """The containers' ``--ulimit``s: the job's ``container.ulimits``, and with InfiniBand an unlimited ``memlock``
    (RDMA pins memory) unless the job names it. (Not ``core=0`` here: once one ``--ulimit`` is given, podman adds
    its own ``nofile``, which a host without CAP_SYS_RESOURCE refuses; core dumps are turned off in the container's
    shell instead, see runtimes.)"""
    limits = dict(spec.container.ulimits)
    if infiniband:
        limits.setdefault("memlock", "-1")
    return tuple(limits.items())


def warm_unavailable(spec: JobSpec, runtime: str) -> str:
    """Why a node of this job has no warm path ("" when it has one)."""
    if spec.recovery != "warm":
        return "recovery: cold in the job"
    if list(spec.torchrun) == ["torchrun"]:
        return ""
    if not runtimes.containerized(runtime) and len(spec.torchrun) == 1 and \
            spec.torchrun[0].rsplit("/", 1)[-1] == "torchrun":
        return ""       # torchrun by its path: its interpreter runs the zygote (on the host)
    return "a custom torchrun command (the zygote runs torch.distributed.run itself)"


def build_plan(spec: JobSpec, hosts: list[Host], *, job_id: str, attempt: int, rdzv_host: Host | None = None,
               interfaces: Mapping[str, str] | None = None, resume_from: str = "", resume_step: int = 0,
               secret_names: Iterable[str] | None = None, pkg_path: str | None = None,
               infiniband: Mapping[str, bool] | None = None, gpu_flags: Mapping[str, str] | None = None,
               jobs_root: str = runtimes.DEFAULT_JOBS_ROOT, spares: Iterable[str] = (),
               excluded: Iterable[tuple[str, str]] = ()) -> LaunchPlan:
    """One attempt's launch plan. ``hosts`` are the chosen nodes in order (their count must fit ``nodes``).

    Rendezvous host: ``rdzv_host``, else ``spec.rendezvous.host``, else ``hosts[0]``; it must be one of ``hosts``.
    ``interfaces``: host name -> NIC (from preflight), else ``host.interface``; unknown -> no *_SOCKET_IFNAME.
    ``secret_names``: default ``spec.secret_env``. ``pkg_path``: where clusterctl lives on the nodes (PYTHONPATH).
    ``infiniband``: host name -> /dev/infiniband/uverbs* found on the node: decides the hosts whose
    ``clusterctl_infiniband`` is auto (``infiniband_on``).
    ``gpu_flags``: host name -> "gpus" | "cdi" (preflight's nvidia_toolkit); absent: the runtime's default.
    """
    if not hosts:
        raise UserError("no hosts to run on")
    names = [h.name for h in hosts]
    if len(set(names)) != len(names):
        raise UserError(f"a host is chosen twice: {', '.join(names)}")
    if not spec.min_nodes <= len(hosts) <= spec.max_nodes:
        want = spec.min_nodes if not spec.elastic else f"{spec.min_nodes} to {spec.max_nodes}"
        raise UserError(f"job {spec.name} needs {want} node(s), got {len(hosts)}: {', '.join(names)}")
    if not JOB_ID_RE.match(job_id):
        raise UserError(f"invalid job id {job_id!r} (letters, digits, '.', '_', '-')")
    if attempt < 0:
        raise UserError(f"attempt must be >= 0, got {attempt}")
    if rdzv_host is None and spec.rendezvous.host is not None:
        rdzv_host = next((h for h in hosts if h.name == spec.rendezvous.host), None)
        if rdzv_host is None:
            raise UserError(f"rendezvous.host {spec.rendezvous.host!r} is not one of the job's hosts: {', '.join(names)}")
    rdzv_host = rdzv_host or hosts[0]
    if rdzv_host.name not in names:
        raise UserError(f"rendezvous host {rdzv_host.name!r} is not one of the job's hosts: {', '.join(names)}")
    secret_names = tuple(spec.secret_env if secret_names is None else secret_names)
    interfaces = interfaces or {}
    infiniband = infiniband or {}
    gpu_flags = gpu_flags or {}
    endpoint = hostport.endpoint(rdzv_host.address, spec.rendezvous.port)
    rdzv_id = f"{job_id}-{attempt}"
    nnodes_arg = nnodes(spec, attempt, len(hosts))

    nodes = []
    for h in hosts:
        ndir = runtimes.node_dir(runtimes.jobs_root_for(jobs_root, h.name), job_id, attempt)
        try:
            rt = runtimes.get(h.runtime)
        except ValueError as e:
            raise UserError(f"{h.name}: {e}") from None
        nproc = _nproc(spec, h)
        is_host = h.name == rdzv_host.name
        targv = torchrun_argv(spec, rdzv_endpoint=endpoint, rdzv_id=rdzv_id, is_host=is_host,
                              local_addr=h.address, nproc=nproc, nnodes_arg=nnodes_arg)
        ib = infiniband_on(h, infiniband.get(h.name))
        env = node_env(spec, h, job_id=job_id, attempt=attempt, interface=interfaces.get(h.name) or h.interface,
                       resume_from=resume_from, resume_step=resume_step, pkg_path=pkg_path,
                       secret_names=secret_names, infiniband=ib, containerized=rt.containerized)
        name = runtimes.container_name(job_id, h.name)
        bare = not rt.containerized      # on the host: the job's workdir defaults to the job file's directory
        req = runtimes.RunRequest(
            job=spec.name, job_id=job_id, attempt=attempt, node=h.name, name=name, image=spec.image,
            workdir=spec.workdir or (spec.source_dir if bare else None), node_dir=ndir, command=tuple(targv),
            mounts=(*spec.mounts, cache_volume(spec.name)) if rt.containerized else tuple(spec.mounts),
            gpus=h.gpus, gpu_flags=gpu_flags.get(h.name),
            infiniband=ib,
            ipc=spec.container.ipc, shm_size=spec.container.shm_size, pids_limit=spec.container.pids_limit,
            ulimits=container_ulimits(spec, ib),
            extra_args=tuple(spec.container.extra_args),
            view_dir=runtimes.view_dir(ndir) if rt.containerized else "")
        cold_why = warm_unavailable(spec, h.runtime)
        warm: dict[str, Any] = {"cold_why": cold_why}
        if not cold_why:
            key = runtimes.warm_key(job_id, h.name)
            wargv = torchrun_argv(spec, rdzv_endpoint=endpoint, rdzv_id=rdzv_id, is_host=is_host,
                                  local_addr=h.address, nproc=nproc, nnodes_arg=nnodes_arg,
                                  warm_dir=runtimes.warm_path(key, rt.containerized))
            # a warm container attempt's ranks run in the zygote's container: their view dir is in the warm dir
            wview = dict(view_dir=f"{runtimes.WARM_PLACEHOLDER}/s/view-{attempt}", view_link=req.view_dir) \
                if rt.containerized else {}
            warm.update(warm_dir=key, zygote_argv=tuple(rt.zygote_start_argv(req, key)),
                        warm_argv=tuple(rt.warm_run_argv(replace(req, command=tuple(wargv), **wview), key)))
        nodes.append(NodePlan(
            host=h.name, address=h.address, runtime=h.runtime, container_name=name,
            runtime_argv=tuple(rt.run_argv(req)), torchrun_argv=tuple(targv), env=env, secret_names=secret_names,
            node_dir=ndir, log_path=rt.log_path(ndir), nproc=nproc, is_rdzv_host=is_host,
            job_id=job_id, infiniband=ib, **warm))
    return LaunchPlan(job=spec.name, job_id=job_id, attempt=attempt, rdzv_endpoint=endpoint, nodes=tuple(nodes),
                      nnodes=nnodes_arg, image=spec.image, spares=tuple(spares), excluded=tuple(excluded),
                      notify=tuple(t.describe() for t in spec.notify))
