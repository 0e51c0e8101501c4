"""``recovery: cold``: every attempt starts each node fresh (its runtime's ``runtime_argv``); nothing is kept on a
node between attempts."""
from __future__ import annotations

from clusterctl.supervise.recovery import NodeStart


class Cold:
    def start(self, n: NodeStart) -> tuple[str, str]:
        n.start_cold()
        return "cold", "the job's first attempt" if n.attempt <= 1 else n.plan.cold_why

    def teardown(self, node, job_id, runtime, run) -> None:
        """Nothing kept on the node."""


STRATEGY = Cold()
