"""Transports: run argv lists on a host (SSH, local or srun) with one interface.

``connect(host, options)`` is the factory the rest of clusterctl receives (dependency injection: tests pass
fakes). ``fan_out`` runs a function on many hosts with a bounded pool and deadlines.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from clusterctl.transport.base import CommandResult, ConnectOptions, Transport
from clusterctl.transport.fanout import HostResult, fan_out

if TYPE_CHECKING:
    from clusterctl.config.inventory import Host


def connect(host: "Host", options: ConnectOptions | None = None) -> Transport:
    """Open a transport for ``host`` according to its ``clusterctl_connection``. The implementations are imported
    here, on first use (``ssh`` imports paramiko), so ``transport.base`` never imports them."""
    options = options or ConnectOptions()
    if host.connection == "local":
        from clusterctl.transport.local import LocalTransport

        return LocalTransport(host, options)
    if host.connection == "srun":
        from clusterctl.transport.srun import SrunTransport

        return SrunTransport(host, options)
    from clusterctl.transport.ssh import SSHTransport

    return SSHTransport(host, options)


__all__ = ["CommandResult", "ConnectOptions", "Transport", "connect", "HostResult", "fan_out"]
