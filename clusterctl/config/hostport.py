"""How an address and a port are written together (pure; imports nothing of clusterctl).

One rule for the rendezvous endpoint torchrun gets (``plan``) and for the endpoints preflight names and connects
to (``checks``): ``host:port``, an IPv6 address in brackets (``[fd00::2]:29500``).
"""
from __future__ import annotations


def endpoint(address: str, port: int) -> str:
    """``host:port``, an IPv6 address in brackets."""
    return f"[{address}]:{port}" if ":" in address else f"{address}:{port}"
