"""Fixtures shared by the unit tests."""
from __future__ import annotations

import pytest

from tests.fakes.sshserver import SSHServer


@pytest.fixture
def servers():
    """Start in-process SSH servers (``servers(...)`` takes SSHServer's arguments); all closed after the test."""
    started = []

    def start(*a, **kw) -> SSHServer:
        s = SSHServer(*a, **kw)
        started.append(s)
        return s

    yield start
    for s in started:
        s.close()
