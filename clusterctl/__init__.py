"""clusterctl: launch and supervise multi-node PyTorch training over SSH."""

__version__ = "0.1.0"
