"""A supervisor port (``NodeOps``) whose stop, reachability, checkpoint and stop request say nothing happened:
a test's fake subclasses it and scripts only ``start``/``observe`` (and what it tests)."""
from __future__ import annotations

from clusterctl.supervise.supervisor import NodeOps


class QuietOps(NodeOps):
    def stop(self, attempt, nodes):
        return {}

    def reachable(self, nodes):
        return list(nodes)

    def latest_checkpoint(self, nodes):
        return ("", 0)

    def stop_requested(self):
        return False
