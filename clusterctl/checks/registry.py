"""Every preflight check and probe, registered once, in order; the check sets everything else uses are built here.

To add a host check: write its parser, its check function and its ``Check`` (and a ``Probe`` if it needs a command
no probe runs yet) in the module of its concern, then add them to ``CHECKS`` (report column order) and ``PROBES``
(script order) below. ``probe.py`` runs only the probes the selected checks need; ``preflight.py`` dispatches on
the records; the report takes the column label from the record; ``launch=True`` puts it in ``launch``'s quick
preflight.
"""
from __future__ import annotations

from typing import FrozenSet, Mapping

from clusterctl.checks import cluster, entry, gpu, network, runtime, storage, system
from clusterctl.checks.model import Check, Probe

CHECKS: tuple[Check, ...] = (
    # host checks (ssh first: where it fails, the others are skipped)
    system.SSH, gpu.DRIVER, gpu.COUNT, gpu.HEALTH, runtime.RUNTIME, runtime.TOOLKIT, runtime.IMAGE,
    network.PORTS, storage.DISK, system.CLOCK, network.RDMA_CHECK, network.INTERFACE,
    # the job's entry point, reported only for the hosts it applies to
    entry.TORCHRUN, entry.SCRIPT,
    # cluster-wide
    cluster.RENDEZVOUS, cluster.SHARED_STORAGE, cluster.CONSISTENCY, cluster.HOSTNAMES, cluster.EXPOSURE,
)
PROBES: tuple[Probe, ...] = (
    cluster.HOSTNAME, gpu.NVIDIA_SMI, gpu.SMI_MODES, gpu.SMI_REMAP, gpu.SMI_FABRIC, gpu.CUDA_INIT, gpu.XID,
    runtime.INFO, runtime.NVIDIA_CTK, runtime.CDI_LIST, runtime.IMAGE_PROBE, runtime.NVIDIA_HOOK, runtime.GPU_RUN,
    network.SS, storage.DF_CHECKPOINT, storage.DF_RUNTIME, system.TIMEDATECTL, network.IP_ADDR, network.IP_LINK,
    network.SSH_CONN, network.GETENT, network.RDMA, network.MEMLOCK, entry.ENTRY,
)

BY_ID: Mapping[str, Check] = {c.id: c for c in CHECKS}
HOST_CHECKS: tuple[str, ...] = tuple(c.id for c in CHECKS if c.kind == "host")
ENTRY_CHECKS: tuple[str, ...] = tuple(c.id for c in CHECKS if c.kind == "entry")
CLUSTER_CHECKS: tuple[str, ...] = tuple(c.id for c in CHECKS if c.kind == "cluster")
ALL_CHECKS: FrozenSet[str] = frozenset(BY_ID)
# The subset the launcher runs before every launch (one round trip per host). rendezvous_exposure only warns: a
# launch whose rendezvous host listens on a public address says so.
LAUNCH_CHECKS: FrozenSet[str] = frozenset(c.id for c in CHECKS if c.launch)
# The GPU part of that quick preflight: what a node left out of a job for a GPU error passes before the supervisor
# uses it again (``ClusterOps.gpu_check``).
GPU_CHECKS: FrozenSet[str] = frozenset(c.id for c in (gpu.DRIVER, gpu.COUNT, gpu.HEALTH))
LABELS: Mapping[str, str] = {c.id: c.label or c.id for c in CHECKS if c.kind != "cluster"}

