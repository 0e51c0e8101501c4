"""Transports: run argv lists on a host (SSH or local) with one interface.

``connect(host, options)`` is the factory the rest of clusterctl receives (dependency injection: tests pass
fakes). ``fan_out`` runs a function on many hosts with a bounded pool and deadlines.
"""
from clusterctl.transport.base import CommandResult, ConnectOptions, Transport, connect
from clusterctl.transport.fanout import HostResult, fan_out

__all__ = ["CommandResult", "ConnectOptions", "Transport", "connect", "HostResult", "fan_out"]
