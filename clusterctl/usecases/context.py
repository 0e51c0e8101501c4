"""The job and its hosts before anything starts, read once per command (``JobContext``), and the "before we
start" policy every command that starts or checks a job applies: the job's hosts (cordons left out), the environment
it needs, usable key files, host keys that are known and unchanged, and the quick preflight."""
from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from clusterctl.config import yamlfile
from clusterctl.config.inventory import Host, Inventory
from clusterctl.config.spec import JobSpec, webhook_problem
from clusterctl.config.yamlfile import line_of
from clusterctl.errors import AuthError, ClusterctlError, HostKeyError, InputError, raise_all
from clusterctl.slurm import allocation
from clusterctl.transport import ConnectOptions
from clusterctl.transport import connect as default_connect
from clusterctl.usecases.base import Connect, Progress
from clusterctl.views import nodes as nodehealth


@dataclass(frozen=True)
class JobContext:
    spec: JobSpec
    inventory: Inventory
    hosts: list[Host]
    excluded: tuple[tuple[str, str], ...] = ()     # (cordoned host, reason), left out of hosts
    recorded: tuple[Host, ...] = ()                # the job's hosts with the cordoned ones (usable once uncordoned)
    data: Any = None                               # the job file as read (with lines): read once per command


def with_overrides(data: Any, overrides: Mapping[str, Any]) -> Any:
    """The job file's data with `launch --name/--nodes/--env K=V -- ARGS` applied (``env`` entries merged, ARGS
    after the file's ``args``; the others replace the file's value), validated as if the file said so."""
    if not overrides or not isinstance(data, dict):
        return data
    out = yamlfile.LineDict(data)
    out.line, out.lines, out.texts = data.line, dict(data.lines), dict(getattr(data, "texts", {}))
    # an error in an overridden value names its flag, not the job file's line (spec.parse_job)
    out.overrides = {("env", k): f"--env {k}" for k in overrides.get("env", {})}
    out.overrides.update({(k,): f"--{k}" for k in overrides if k not in ("env", "args")})
    for key, value in overrides.items():
        if key == "args":     # `launch job.yaml -- ARGS`: after the file's own args (kept at their lines)
            old = data.get("args")
            args = yamlfile.LineList([*(old if isinstance(old, list) else []), *value])
            args.line, args.lines = getattr(old, "line", 0), dict(getattr(old, "lines", {}))
            args.texts = dict(getattr(old, "texts", {}))
            first = len(args) - len(value)
            out.overrides.update({("args", first + i): f"script argument {a!r} (after --)" for i, a in enumerate(value)})
            out["args"] = args if isinstance(old, list) or old is None else old
        elif key == "env":
            env = yamlfile.LineDict(data.get("env") or {})
            old = data.get("env")
            env.line, env.lines = getattr(old, "line", 0), dict(getattr(old, "lines", {}))
            env.texts = dict(getattr(old, "texts", {}))
            env.update(value)
            out["env"] = env
        else:
            out[key] = value
    return out


def load_context(job_path: str, inventory_path: str | None, cordons: Mapping[str, Any] | None = None,
                 overrides: Mapping[str, Any] | None = None) -> JobContext:
    """The job and the hosts it will use, checked against each other (errors at the job file's line).
    ``cordons``: host -> cordon (``Store.cordons()``); those hosts are left out (``excluded``). ``overrides``:
    `launch --name/--nodes/--env` (``with_overrides``). The job file is read once."""
    from clusterctl.config.spec import parse_job

    data = with_overrides(yamlfile.load_yaml_with_lines(job_path), overrides or {})
    spec = parse_job(data, job_path)
    inv = allocation.load_hosts(inventory_path)

    def bad(key: str, message: str) -> InputError:
        flag = getattr(data, "overrides", {}).get((key,))      # `launch --nodes 9`: the flag, not the file's line
        return InputError(flag, None, message) if flag else InputError(job_path, line_of(data, key), message, key=key)

    everyone = _job_hosts(spec, inv, data, job_path) if spec.hosts else list(inv.hosts)
    hosts, excluded = nodehealth.split(everyone, cordons or {})
    if len(hosts) < spec.min_nodes:
        if excluded:
            raise nodehealth.too_few(spec.min_nodes, len(hosts), excluded)
        raise bad("nodes", f"the job needs at least {spec.min_nodes} node(s) but the inventory {inv.source} "
                           f"offers {len(hosts)}: {', '.join(h.name for h in hosts)}")
    for h in hosts:
        if spec.nproc_per_node == "gpu" and not h.gpus:
            raise bad("nproc_per_node", f"\"gpu\" but {h.name} has no GPUs (clusterctl_gpus)")
        if isinstance(spec.nproc_per_node, int) and h.gpus and spec.nproc_per_node > h.gpus:
            raise bad("nproc_per_node", f"{spec.nproc_per_node} > {h.gpus} GPUs on {h.name}")
    chosen = hosts if spec.hosts is not None or inv.allocation else hosts[: spec.max_nodes]
    rdzv = spec.rendezvous.host
    if rdzv is not None and rdzv not in [h.name for h in chosen[: spec.max_nodes]]:
        why = (" (it is cordoned)" if rdzv in dict(excluded) else " (it is a spare: beyond nodes' MAX)"
               if rdzv in [h.name for h in chosen] else "")
        rdzv_node = data.get("rendezvous") if isinstance(data, dict) else None
        raise InputError(job_path, line_of(rdzv_node, "host"),
                         f"{rdzv!r} is not one of the job's hosts{why}: "
                         f"{', '.join(h.name for h in chosen[: spec.max_nodes])}; pick one of them or leave it "
                         "out (the first node holds the rendezvous)", key="rendezvous.host")
    cordoned = dict(excluded)
    recorded = tuple(h for h in everyone if h in chosen or h.name in cordoned)
    return JobContext(spec, inv, chosen, tuple(excluded), recorded, data)


def _job_hosts(spec: JobSpec, inv: Inventory, data: Any, job_path: str) -> list[Host]:
    """The job's ``hosts:`` resolved; an unknown name is an error at its line with the nearest name."""
    known = [*inv.groups, *(h.name for h in inv.hosts)]
    for i, p in enumerate(spec.hosts or ()):
        if p not in known:
            hint = difflib.get_close_matches(p, known, 1)
            raise InputError(job_path, line_of(data.get("hosts"), i),
                             f"no host or group {p!r} in the inventory {inv.source}"
                             + (f" (did you mean {hint[0]!r}?)" if hint else
                                f"; it has {', '.join(h.name for h in inv.hosts[:8])}"), key=f"hosts[{i}]")
    return inv.select(spec.hosts or ())


def check_environment(job_path: str, spec: JobSpec, environ: Mapping[str, str], data: Any = None) -> None:
    """Every ``secret_env`` name and ``notify[].webhook_env`` set in clusterctl's environment, else an error at its
    line, all of them at once (a launch needs them; ``--dry-run`` warns: it shows ***)."""
    raise_all(environment_problems(job_path, spec, environ, data))


def environment_problems(job_path: str, spec: JobSpec, environ: Mapping[str, str],
                         data: Any = None) -> list[InputError]:
    """The ``secret_env`` / ``notify[].webhook_env`` variables missing from ``environ``, each at its line (the
    names only: a value is never printed). ``data``: the job file as ``load_context`` read it (else read here)."""
    data = yamlfile.load_yaml_with_lines(job_path) if data is None else data
    problems = []
    for i, name in enumerate(spec.secret_env):
        if name not in environ:
            problems.append(InputError(job_path, line_of(data.get("secret_env"), i),
                                       f"{name} is not set in clusterctl's environment: `export {name}=...` before "
                                       "the launch (the value is sent to the nodes on stdin, never printed or "
                                       "stored)", key=f"secret_env[{i}]"))
    for i, t in enumerate(spec.notify):
        if t.webhook_env is not None and not environ.get(t.webhook_env):
            entry = data["notify"][i]
            problems.append(InputError(job_path, line_of(entry, "webhook_env"),
                                       f"{t.webhook_env} is not set in clusterctl's environment: `export "
                                       f"{t.webhook_env}=https://...` before the launch",
                                       key=f"notify[{i}].webhook_env"))
        elif t.webhook_env is not None and webhook_problem(environ[t.webhook_env], t.allow_http):
            problems.append(InputError(job_path, line_of(data["notify"][i], "webhook_env"),
                                       f"${t.webhook_env} {webhook_problem(environ[t.webhook_env], t.allow_http)}",
                                       key=f"notify[{i}].webhook_env"))
    return problems


def launch_problems(job_path: str, spec: JobSpec, hosts: Sequence[Host],
                    environ: Mapping[str, str], data: Any = None) -> list[InputError]:
    """What ``launch`` would refuse before contacting any host: unset secret/webhook variables (or a plain-http
    webhook), unusable SSH key files. ``launch --dry-run`` prints each as a warning (exit 2 with ``--strict``)."""
    from clusterctl.transport.ssh import key_file_problems

    return (environment_problems(job_path, spec, environ, data) + local_torchrun_problems(job_path, spec, hosts, data)
            + key_file_problems(hosts))


def local_torchrun_problems(job_path: str, spec: JobSpec, hosts: Sequence[Host], data: Any = None) -> list[InputError]:
    """The check launch's preflight makes of a ``local`` bare host's torchrun, made here without a preflight
    (``validate``, ``--dry-run``): found on PATH or beside clusterctl's interpreter (``transport.local``)."""
    from clusterctl.launch import runtimes
    from clusterctl.transport.local import local_path, which_local

    name = spec.torchrun[0]
    for h in hosts:
        if h.connection == "local" and not runtimes.containerized(h.runtime) and not which_local(name):
            return [InputError(job_path, line_of(data, "torchrun") if isinstance(data, dict) else None,
                               f"{name} not found on {h.name}'s PATH ({local_path()}, then clusterctl's interpreter's "
                               "directory): activate the venv that has torch, install torch beside clusterctl "
                               "(`make install`), or set `torchrun:` to its full path", key="torchrun")]
    return []


def check_key_files(hosts: Sequence[Host]) -> None:
    """Unusable ansible_ssh_private_key_file -> exit 2 at its inventory line, before anything connects."""
    from clusterctl.transport.ssh import check_key_files as check

    check(hosts)


def verify_host_keys(hosts: Sequence[Host], options: ConnectOptions, connect: Connect = default_connect) -> None:
    """Connect to every host once. A changed/unknown host key or a refused login is an error now (with the
    transport's message: fingerprints, known_hosts file:line, the fix), not a node the supervisor waits for.
    Unreachable hosts are left to the supervisor (they may come back)."""
    from clusterctl.transport import fan_out

    def probe(h: Host) -> None:
        t = connect(h, options)
        try:
            t.run(["true"], timeout=options.command_timeout)
        finally:
            t.close()

    results = fan_out(list(hosts), probe, host_timeout=options.connect_timeout * 3 + options.command_timeout)
    bad = [r.error for r in results if isinstance(r.error, (HostKeyError, AuthError))]
    if bad:
        raise ClusterctlError("cannot connect safely:\n" + "\n".join(f"  {e}" for e in bad))


def quick_preflight(hosts: Sequence[Host], spec: JobSpec, options: ConnectOptions, *,
                    connect: Connect = default_connect, on_progress: Progress | None = None):
    """The launch subset of preflight (``LAUNCH_CHECKS``: one round trip per host) -> ``PreflightReport``."""
    from clusterctl.checks.job import PreflightJob
    from clusterctl.checks.preflight import run_preflight
    from clusterctl.checks.registry import LAUNCH_CHECKS

    return run_preflight(hosts, connect=lambda h: connect(h, options), job=PreflightJob.from_spec(spec),
                         only=LAUNCH_CHECKS, progress=on_progress)
