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
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping, Sequence

from clusterctl.checks import cluster as cl
from clusterctl.checks import registry
from clusterctl.checks.job import PreflightJob, PreflightOptions
from clusterctl.checks.model import HostProbe, Section
from clusterctl.checks.probe import build_probe_script, nonce_path, split_sections
from clusterctl.checks.registry import ALL_CHECKS, CLUSTER_CHECKS, HOST_CHECKS
from clusterctl.checks.results import CheckResult, ClusterCheck, HostReport, PreflightReport, skipped
from clusterctl.checks.system import check_ssh, check_ssh_error
from clusterctl.config.hostport import endpoint
from clusterctl.errors import UserError

if TYPE_CHECKING:
    from clusterctl.config.inventory import Host
    from clusterctl.transport.base import Transport

__all__ = ["HostProbe", "Progress", "evaluate_host", "run_preflight"]

Progress = Callable[[int, int, str], None]    # (done, total, label)


def evaluate_host(probe: HostProbe) -> dict[str, CheckResult]:
    """Every per-host check over one probe (pure): the host checks, then the entry checks where they apply."""
    out = {"ssh": check_ssh(probe)}
    if out["ssh"].status == "fail":
        return out | {cid: skipped(cid, "ssh failed") for cid in HOST_CHECKS if cid != "ssh"}
    for c in registry.CHECKS:
        if c.kind in ("host", "entry") and c.id != "ssh":
            result = c.fn(probe)
            if result is not None:
                out[c.id] = result
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
    """The cluster checks: those judged from phase 1 alone, then (when wanted) phase 2's plan, its run, its verdicts."""
    first = hosts[0]
    plan = plan_cluster(hosts, probes, host_checks, pjob, nonce, share, rdzv_wanted)
    out: list[ClusterCheck] = []
    if options.wants("hostnames"):
        out.append(cl.check_hostnames({h.name: _hostname(probes.get(h.name)) for h in hosts}))
    if options.wants("consistency"):
        out.append(cl.check_consistency({h.name: host_checks[h.name] for h in hosts
                                         if h.name in probes and host_checks[h.name]["ssh"].status != "fail"}))
    if options.wants("rendezvous_exposure") and len(hosts) > 0:
        out.append(cl.check_exposure(probes[first.name], plan.port) if plan.rdzv_ok else
                   ClusterCheck("rendezvous_exposure", "skip", f"{first.name} unreachable", None, (first.name,)))
    if not (share or rdzv_wanted):
        for cid, why in (("rendezvous_reachable", "single host"), ("shared_storage", _share_skip(pjob, hosts))):
            out.append(ClusterCheck(cid, "skip", why, None, ()))
        return out
    by_name, listener = _run_cluster(plan, probes, options, fan)
    return out + judge_cluster(plan, pjob, hosts, nonce, by_name, listener, options)


@dataclass(frozen=True)
class ClusterPlan:
    """What phase 2 runs, decided from phase 1 alone (pure)."""
    first: "Host"                       # the rendezvous host
    port: int
    rdzv_ok: bool                       # the rendezvous host answered phase 1
    peers: tuple["Host", ...]           # the other hosts that answered
    share: bool                         # shared_storage is checked
    rdzv_wanted: bool                   # rendezvous_reachable is checked
    written: Section | None             # the rendezvous host's nonce_write section
    read_nonce: str | None              # the nonce file the peers read (None: it was not written)
    port_busy: bool                     # the rendezvous port is taken on the rendezvous host (see ports)
    listen: bool                        # run the temporary rendezvous listener

    @property
    def targets(self) -> list["Host"]:
        return ([self.first] if self.listen else []) + (list(self.peers) if self.listen or self.read_nonce else [])

    def script(self, host: "Host", options: PreflightOptions) -> str:
        if host is self.first:
            return cl.listener_script(self.port, len(self.peers), options.rendezvous_timeout_s + 2.0,
                                      ":" in self.first.address, self.read_nonce)
        return cl.peer_script(self.first.address if self.listen else None, self.port, options.rendezvous_timeout_s,
                              self.read_nonce)


def plan_cluster(hosts: Sequence["Host"], probes: Mapping[str, HostProbe],
                 host_checks: Mapping[str, Mapping[str, CheckResult]], pjob: PreflightJob | None, nonce: str,
                 share: bool, rdzv_wanted: bool) -> ClusterPlan:
    job = pjob or PreflightJob()
    first = hosts[0]
    ok = [h for h in hosts if h.name in probes and host_checks[h.name]["ssh"].status != "fail"]
    rdzv_ok = bool(ok) and ok[0] is first
    written = probes[first.name].sections.get("nonce_write") if rdzv_ok and share else None
    nonce_file = nonce_path(job.checkpoint_dir, nonce) if share and job.checkpoint_dir else None
    port_busy = rdzv_ok and host_checks[first.name].get("ports", skipped("ports", "")).status == "fail"
    peers = tuple(h for h in ok if h is not first)
    return ClusterPlan(first, job.rdzv_port, rdzv_ok, peers, share, rdzv_wanted, written,
                       nonce_file if written is not None and written.rc == 0 else None, port_busy,
                       listen=rdzv_wanted and rdzv_ok and bool(peers) and not port_busy)


def _run_cluster(plan: ClusterPlan, probes: Mapping[str, HostProbe], options: PreflightOptions,
                 fan) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """Phase 2's I/O: one command per target over the transports phase 1 left open; the nonce file removed when
    the listener did not. Returns (peer name -> parse_peer() or the error, the listener's parse_listener())."""
    def phase2(host: "Host") -> dict[str, Any]:
        res = probes[host.name].transport.run(["sh", "-c", plan.script(host, options)],
                                              timeout=options.rendezvous_timeout_s + 15.0)
        return (cl.parse_listener if host is plan.first else cl.parse_peer)(res.stdout, res.exit_code)

    targets = plan.targets
    results = fan(targets, phase2, max_workers=options.max_workers, host_timeout=None,
                  deadline=options.deadline_s) if targets else []
    by_name: dict[str, Any] = {h.name: (r.error if r.error is not None else r.value) for h, r in zip(targets, results)}
    listener = by_name.pop(plan.first.name, None) if plan.listen else None
    if isinstance(listener, BaseException):
        listener = {"error": f"no answer ({getattr(listener, 'message', listener)})"}
    if plan.read_nonce and not (isinstance(listener, dict) and listener.get("removed")):
        try:  # failure path only: the listener did not remove the nonce file
            probes[plan.first.name].transport.run(["rm", "-f", "--", plan.read_nonce],
                                                  timeout=options.command_timeout_s)
        except Exception:  # noqa: BLE001 - best effort
            pass
    return by_name, listener


def judge_cluster(plan: ClusterPlan, pjob: PreflightJob | None, hosts: Sequence["Host"], nonce: str,
                  by_name: Mapping[str, Any], listener: dict[str, Any] | None,
                  options: PreflightOptions) -> list[ClusterCheck]:
    """rendezvous_reachable and shared_storage from the plan and phase 2's answers (pure)."""
    out: list[ClusterCheck] = []
    first, port = plan.first, plan.port

    def skip(cid: str, why: str, where: tuple[str, ...] = (first.name,)) -> None:
        out.append(ClusterCheck(cid, "skip", why, None, where))

    if not plan.rdzv_wanted:
        pass
    elif not plan.rdzv_ok:
        skip("rendezvous_reachable", f"rendezvous host {first.name} unreachable")
    elif not plan.peers:
        skip("rendezvous_reachable", "no other reachable host")
    elif plan.port_busy:
        skip("rendezvous_reachable", f"port {port} is in use on {first.name} (see ports)")
    else:
        out.append(cl.check_rendezvous(first.name, endpoint(first.address, port), by_name, listener))

    if not options.wants("shared_storage"):
        pass
    elif not plan.share:
        skip("shared_storage", _share_skip(pjob, list(hosts)), ())
    elif not plan.rdzv_ok:
        skip("shared_storage", f"{first.name} unreachable")
    elif not plan.peers:
        skip("shared_storage", "no other reachable host")
    else:
        directory = (pjob or PreflightJob()).checkpoint_dir
        assert directory
        out.append(cl.check_shared_storage(first.name, directory, nonce, plan.written,
                                           {h.name: by_name.get(h.name, RuntimeError("not run")) for h in plan.peers}))
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
