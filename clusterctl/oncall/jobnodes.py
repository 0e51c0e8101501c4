"""Where a job runs now: the hosts of its current attempt and, per node, where its processes live (pure reads of
the state store and the job record). Used by ``exec --job``, ``shell``, ``stacks`` and ``fabric.group``."""
from __future__ import annotations

from dataclasses import dataclass

from clusterctl.config.inventory import Host
from clusterctl.config.spec import JobSpec
from clusterctl.errors import UserError
from clusterctl.launch import runtimes
from clusterctl.model import events as events_mod
from clusterctl.model import record as record_mod
from clusterctl.store.state import Job, Store


@dataclass(frozen=True)
class JobNodes:
    job: Job
    spec: JobSpec
    attempt: int
    rdzv_host: str
    nodes: tuple[str, ...]            # the current attempt's nodes, in rank order
    hosts: dict[str, Host]            # every host of the job, by inventory name
    warm: frozenset[str] = frozenset()    # the nodes whose current attempt was forked by their zygote

    def host(self, node: str) -> Host:
        return self.hosts[node]

    def pick(self, node: str | None) -> list[str]:
        """``--node N`` (must be one of the attempt's nodes), else every node of the attempt."""
        if node is None:
            return list(self.nodes)
        if node not in self.nodes:
            raise UserError(f"--node {node}: not a node of job {self.job.name} attempt {self.attempt} "
                            f"(nodes: {', '.join(self.nodes)})")
        return [node]

    def container(self, node: str) -> str:
        return runtimes.container_name(self.job.job_id, node)

    def workdir(self) -> str:
        """The directory a bare job runs in (its ``workdir``, else the job file's directory)."""
        return self.spec.workdir or self.spec.source_dir

    def node_dir(self, node: str) -> str:
        return runtimes.node_dir_of(node, self.job.job_id, self.attempt)


def load(store: Store, job_ref: str) -> JobNodes:
    """The job (by name or id) and its current attempt. A job that never started an attempt is an error."""
    job = store.get_job(job_ref)
    attempts = store.attempts(job.job_id)
    if not attempts:
        raise UserError(f"job {job.name} ({job.job_id}) has not started an attempt yet")
    a = attempts[-1]
    rec = record_mod.from_job(job)     # the hosts as resolved at launch
    hosts = rec.hosts_by_name
    missing = [n for n in a.nodes if n not in hosts]
    if missing:
        raise UserError(f"nodes {', '.join(missing)} of job {job.name} are not in its record")
    warm = frozenset(r.node for r in map(events_mod.relaunch_of, store.events(job.job_id))
                     if r is not None and r.attempt == a.attempt and r.mode == "warm")
    return JobNodes(job, rec.spec, a.attempt, a.rdzv_host or a.nodes[0], tuple(a.nodes), hosts, warm)


def in_job_argv(jn: JobNodes, node: str, argv: list[str], *, interactive: bool = False, tty: bool = False) -> list[str]:
    """``argv`` where the job runs on ``node``: in its container (``exec [-i] [-t] NAME argv``; on a warm attempt
    the zygote's container, where its ranks are), or for a bare job on the host in the job's directory."""
    rt = runtimes.get(jn.host(node).runtime)
    if node in jn.warm:
        warm = rt.zygote_exec_argv(jn.job.job_id, node, argv, interactive=interactive, tty=tty)
        if warm is not None:
            return warm
    ref = runtimes.Ref(jn.container(node), jn.node_dir(node), None, jn.job.job_id)   # selected by the job's label
    return rt.exec_argv(ref, argv, interactive=interactive, tty=tty, workdir=jn.workdir())
