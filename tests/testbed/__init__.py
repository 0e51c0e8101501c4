"""Real multi-host testbed: network namespaces + OpenSSH + podman + stub GPU tools (see core.py, stubs.py)."""

from .containers import IMAGE
from .core import Host, PortHandle, Testbed, cleanup_stale
from .stubs import profile

__all__ = ["IMAGE", "Host", "PortHandle", "Testbed", "cleanup_stale", "profile"]
