"""``run_preflight``: probe every host in one round trip, run the cluster-wide checks in a second one.

Phase 1 (every host, in parallel): connect, then one ``sh -c SCRIPT`` (see ``probe.py``); the output is split
into sections and each check is a pure function of them. Phase 2 (only when a cluster check needs traffic
between hosts): one more command per host (see ``cluster.py``). Transports stay open between the phases and are
closed at the end.
"""
from __future__ import annotations

import secrets
import threading
import time
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping, Sequence

from clusterctl.checks import cluster as cl
from clusterctl.checks.entry import check_script, check_torchrun
from clusterctl.checks.gpu import check_gpu_count, check_gpu_driver, check_gpu_health
from clusterctl.checks.job import ALL_CHECKS, CLUSTER_CHECKS, HOST_CHECKS, PreflightJob, PreflightOptions
from clusterctl.checks.network import check_interface, check_ports
from clusterctl.checks.probe import Section, build_probe_script, nonce_path, split_sections
from clusterctl.checks.results import CheckResult, ClusterCheck, HostReport, PreflightReport, skipped
from clusterctl.checks.runtime import check_container_runtime, check_image, check_nvidia_toolkit
from clusterctl.checks.storage import check_disk
from clusterctl.checks.system import check_clock, check_ssh, check_ssh_error, parse_epoch
from clusterctl.errors import UserError

if TYPE_CHECKING:
    from clusterctl.inventory import Host
    from clusterctl.transport.base import Transport

Progress = Callable[[int, int, str], None]    # (done, total, label)

HOST_CHECK_FUNCS: Mapping[str, Callable[["HostProbe"], CheckResult]] = {
    "ssh": check_ssh, "gpu_driver": check_gpu_driver, "gpu_count": check_gpu_count, "gpu_health": check_gpu_health,
    "container_runtime": check_container_runtime, "nvidia_toolkit": check_nvidia_toolkit, "image": check_image,
    "ports": check_ports, "disk": check_disk, "clock": check_clock, "interface": check_interface,
}


ENTRY_CHECK_FUNCS: Mapping[str, Callable[["HostProbe"], CheckResult | None]] = {
    "torchrun": check_torchrun, "script": check_script,
}


@dataclass(frozen=True)
class HostProbe:
    """Everything phase 1 learned about one host: the input of every per-host check."""

    host: "Host"
    job: PreflightJob | None
    options: PreflightOptions
    sections: Mapping[str, Section]
    exit_code: int = 0
    stderr: str = ""
    connect_s: float = 0.0
    rtt_s: float = 0.0          # the probe command, controller side
    sent: float = 0.0           # controller wall clock before / after the command
    received: float = 0.0
    transport: Any = field(default=None, compare=False, repr=False)

    @property
    def image(self) -> str:
        return (self.job or PreflightJob()).image

    @property
    def rdzv_port(self) -> int:
        return (self.job or PreflightJob()).rdzv_port

    @property
    def script_s(self) -> float:
        a, b = self.sections.get("clock0"), self.sections.get("clock1")
        t0, t1 = (parse_epoch(a.output) if a else None), (parse_epoch(b.output) if b else None)
        return max(0.0, t1 - t0) if t0 is not None and t1 is not None else 0.0


def evaluate_host(probe: HostProbe) -> dict[str, CheckResult]:
    """Every per-host check over one probe (pure)."""
    out = {"ssh": check_ssh(probe)}
    if out["ssh"].status == "fail":
        return out | {cid: skipped(cid, "ssh failed") for cid in HOST_CHECKS if cid != "ssh"}
    for cid, fn in HOST_CHECK_FUNCS.items():
        if cid != "ssh":
            out[cid] = fn(probe)
    for cid, fn in ENTRY_CHECK_FUNCS.items():     # only where they apply to this host
        result = fn(probe)
        if result is not None:
            out[cid] = result
    return out


def _default_fan_out():
    from clusterctl.transport.fanout import fan_out

    return fan_out


def run_preflight(hosts: Sequence["Host"], *, connect: Callable[["Host"], "Transport"], job: Any = None,
                  options: PreflightOptions | None = None, only: Iterable[str] | None = None,
                  progress: Progress | None = None, fan_out: Callable[..., list] | None = None,
                  clock: Callable[[], float] = time.time, monotonic: Callable[[], float] = time.perf_counter,
                  nonce: str | None = None) -> PreflightReport:
    """Run the preflight checks on ``hosts`` (the first is the would-be rendezvous host).

    ``connect(host) -> Transport``; ``job``: a ``PreflightJob``, anything shaped like a JobSpec, or None (the
    default image and rendezvous port, no checkpoint dir); ``only``: check ids to run (``ssh`` always runs).
    Unreachable hosts are results, never exceptions.
    """
    options = options or PreflightOptions()
    only = only if only is not None else options.only
    if only is not None:
        only = frozenset(only) | {"ssh"}
        unknown = only - ALL_CHECKS
        if unknown:
            raise UserError(f"unknown preflight check(s): {', '.join(sorted(unknown))} "
                            f"(known: {', '.join(sorted(ALL_CHECKS))})")
        options = replace(options, only=only)
    pjob = job if job is None or isinstance(job, PreflightJob) else PreflightJob.from_spec(job)
    fan = fan_out or _default_fan_out()
    hosts = list(hosts)
    nonce = nonce or secrets.token_hex(8)
    start = monotonic()
    multi = len(hosts) > 1
    share = bool(options.wants("shared_storage") and pjob and pjob.checkpoint_dir and multi)
    rdzv_wanted = options.wants("rendezvous_reachable") and multi
    phase2 = share or rdzv_wanted
    total = len(hosts) + (1 if phase2 else 0)
    transports: dict[str, Any] = {}
    lock = threading.Lock()
    finished = threading.Event()
    done = [0]

    def tick(label: str) -> None:
        done[0] += 1
        if progress:
            progress(done[0], total, label)

    def probe(host: "Host") -> HostProbe:
        m0 = monotonic()
        tr = connect(host)
        with lock:
            transports[host.name] = tr
        if finished.is_set():
            tr.close()
            raise RuntimeError("preflight already finished")
        if callable(getattr(tr, "connect", None)):
            tr.connect()
        connect_s = monotonic() - m0
        script = build_probe_script(host, pjob, options, nonce=nonce if share and host is hosts[0] else None)
        timeout = options.command_timeout_s + (options.pull_timeout_s if options.pull else 0.0)
        sent, m1 = clock(), monotonic()
        res = tr.run(["sh", "-c", script], timeout=timeout)
        rtt, received = monotonic() - m1, clock()
        if finished.is_set():  # abandoned by the fan-out's deadline: nobody will close it later
            tr.close()
        return HostProbe(host, pjob, options, split_sections(res.stdout), res.exit_code, res.stderr,
                         connect_s, rtt, sent, received, tr)

    def on_result(r) -> None:
        tick(getattr(r.host, "name", str(r.host)))

    try:
        results = fan(hosts, probe, max_workers=options.max_workers, host_timeout=None,
                      deadline=options.deadline_s, on_result=on_result)
        probes: dict[str, HostProbe] = {}
        host_checks: dict[str, dict[str, CheckResult]] = {}
        for host, r in zip(hosts, results):
            if r.error is not None or r.value is None:
                err = r.error or RuntimeError("no result")
                host_checks[host.name] = {"ssh": check_ssh_error(err, host)} | {
                    cid: skipped(cid, "ssh failed") for cid in HOST_CHECKS if cid != "ssh"}
            else:
                probes[host.name] = r.value
                host_checks[host.name] = evaluate_host(r.value)
        cluster_checks = _cluster_phase(hosts, probes, host_checks, pjob, options, fan, nonce, share, rdzv_wanted)
        if phase2:
            tick("cluster checks")
    finally:
        finished.set()
        with lock:
            open_transports = list(transports.values())
        for tr in open_transports:
            try:
                tr.close()
            except Exception:  # noqa: BLE001 - closing is best effort
                pass

    reports = [HostReport(h.name, h.address, tuple(c for cid, c in host_checks[h.name].items()
                                                   if options.wants(cid))) for h in hosts]
    cluster_list = sorted((c for c in cluster_checks if options.wants(c.id)), key=lambda c: CLUSTER_CHECKS.index(c.id))
    return PreflightReport.build(reports, cluster_list, monotonic() - start)


def _cluster_phase(hosts: list["Host"], probes: dict[str, HostProbe], host_checks: dict[str, dict[str, CheckResult]],
                   pjob: PreflightJob | None, options: PreflightOptions, fan, nonce: str, share: bool,
                   rdzv_wanted: bool) -> list[ClusterCheck]:
    out: list[ClusterCheck] = []
    job = pjob or PreflightJob()
    port = job.rdzv_port
    first = hosts[0]
    endpoint = f"{first.address}:{port}" if ":" not in first.address else f"[{first.address}]:{port}"
    ok = [h for h in hosts if h.name in probes and host_checks[h.name]["ssh"].status != "fail"]
    rdzv_ok = bool(ok) and ok[0] is first
    peers = [h for h in ok if h is not first]

    if options.wants("hostnames"):
        out.append(cl.check_hostnames({h.name: _hostname(probes.get(h.name)) for h in hosts}))
    if options.wants("consistency"):
        out.append(cl.check_consistency({h.name: host_checks[h.name] for h in ok}))
    if options.wants("rendezvous_exposure") and len(hosts) > 0:
        out.append(cl.check_exposure(probes[first.name], port) if rdzv_ok else
                   ClusterCheck("rendezvous_exposure", "skip", f"{first.name} unreachable", None, (first.name,)))

    if not (share or rdzv_wanted):
        for cid, why in (("rendezvous_reachable", "single host"), ("shared_storage", _share_skip(pjob, hosts))):
            out.append(ClusterCheck(cid, "skip", why, None, ()))
        return out

    written = probes[first.name].sections.get("nonce_write") if rdzv_ok and share else None
    nonce_file = nonce_path(job.checkpoint_dir, nonce) if share and job.checkpoint_dir else None
    read_nonce = nonce_file if written is not None and written.rc == 0 else None
    port_busy = rdzv_ok and host_checks[first.name].get("ports", skipped("ports", "")).status == "fail"
    listen = rdzv_wanted and rdzv_ok and bool(peers) and not port_busy

    def phase2(host: "Host") -> dict[str, Any]:
        tr = probes[host.name].transport
        if host is first:
            script = cl.listener_script(port, len(peers), options.rendezvous_timeout_s + 2.0, ":" in first.address,
                                        read_nonce)
            res = tr.run(["sh", "-c", script], timeout=options.rendezvous_timeout_s + 15.0)
            return cl.parse_listener(res.stdout, res.exit_code)
        script = cl.peer_script(first.address if listen else None, port, options.rendezvous_timeout_s, read_nonce)
        res = tr.run(["sh", "-c", script], timeout=options.rendezvous_timeout_s + 15.0)
        return cl.parse_peer(res.stdout, res.exit_code)

    targets = ([first] if listen else []) + (peers if (listen or read_nonce) else [])
    results = fan(targets, phase2, max_workers=options.max_workers, host_timeout=None,
                  deadline=options.deadline_s) if targets else []
    by_name: dict[str, Any] = {h.name: (r.error if r.error is not None else r.value) for h, r in zip(targets, results)}
    listener = by_name.pop(first.name, None) if listen else None
    if isinstance(listener, BaseException):
        listener = {"error": f"no answer ({getattr(listener, 'message', listener)})"}

    if read_nonce and not (isinstance(listener, dict) and listener.get("removed")):
        try:  # failure path only: the listener did not remove the nonce file
            probes[first.name].transport.run(["rm", "-f", "--", read_nonce], timeout=options.command_timeout_s)
        except Exception:  # noqa: BLE001 - best effort
            pass

    if not rdzv_wanted:
        pass
    elif not rdzv_ok:
        out.append(ClusterCheck("rendezvous_reachable", "skip", f"rendezvous host {first.name} unreachable", None,
                                (first.name,)))
    elif not peers:
        out.append(ClusterCheck("rendezvous_reachable", "skip", "no other reachable host", None, (first.name,)))
    elif port_busy:
        out.append(ClusterCheck("rendezvous_reachable", "skip", f"port {port} is in use on {first.name} (see ports)",
                                None, (first.name,)))
    else:
        out.append(cl.check_rendezvous(first.name, endpoint, by_name, listener))

    if not options.wants("shared_storage"):
        pass
    elif not share:
        out.append(ClusterCheck("shared_storage", "skip", _share_skip(pjob, hosts), None, ()))
    elif not rdzv_ok:
        out.append(ClusterCheck("shared_storage", "skip", f"{first.name} unreachable", None, (first.name,)))
    elif not peers:
        out.append(ClusterCheck("shared_storage", "skip", "no other reachable host", None, (first.name,)))
    else:
        assert job.checkpoint_dir
        out.append(cl.check_shared_storage(first.name, job.checkpoint_dir, nonce, written,
                                           {h.name: by_name.get(h.name, RuntimeError("not run")) for h in peers}))
    return out


def _share_skip(pjob: PreflightJob | None, hosts: list["Host"]) -> str:
    if pjob is None or not pjob.checkpoint_dir:
        return "no checkpoint dir in the job"
    return "single host" if len(hosts) < 2 else "not run"


def _hostname(p: HostProbe | None) -> str | None:
    if p is None:
        return None
    s = p.sections.get("hostname")
    return s.output.strip() or None if s is not None and s.rc == 0 else None
