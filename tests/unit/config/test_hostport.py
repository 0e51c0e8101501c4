"""One rule for ``host:port`` (issue 9 item 5): the rendezvous endpoint of a plan and the endpoints preflight
names are written by the same function."""
from __future__ import annotations

import pytest

from clusterctl.config import hostport


@pytest.mark.parametrize("address,port,expected", [
    ("10.1.0.12", 29500, "10.1.0.12:29500"),
    ("node1.example", 29400, "node1.example:29400"),
    ("fd00::2", 29400, "[fd00::2]:29400"),
    ("::1", 1, "[::1]:1"),
    ("fe80::1%eth0", 29500, "[fe80::1%eth0]:29500"),
])
def test_endpoint(address, port, expected):
    assert hostport.endpoint(address, port) == expected


def test_plan_and_checks_use_the_one_rule():
    from clusterctl.checks import network, preflight
    from clusterctl.launch import plan

    assert network.endpoint is preflight.endpoint is hostport.endpoint
    assert plan.hostport is hostport
