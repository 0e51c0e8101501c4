"""LocalTransport (the ``local`` connection) holds what a command prints as SSH and srun do: the last
``MAX_OUTPUT`` bytes of each stream, not all of it (``subprocess.run`` kept everything: 200 MB of output was
200 MB in the controller). Stdin, exit codes and the deadline as before."""
from __future__ import annotations

import time

import pytest

from clusterctl.config.inventory import Host
from clusterctl.errors import CommandTimeout
from clusterctl.transport import ConnectOptions
from clusterctl.transport.local import LocalTransport
from tests.unit.transport.bounded import assert_keeps_the_last_8_mib


@pytest.fixture
def transport():
    return LocalTransport(Host(name="localhost", address="localhost", connection="local"),
                          ConnectOptions(command_timeout=60))


def test_100_mb_of_output_keeps_the_last_8_mib_and_memory_bounded(transport):
    assert_keeps_the_last_8_mib(transport, 100, 20)


def test_stdin_exit_code_missing_command_and_deadline(transport):
    r = transport.run(["sh", "-c", "wc -c; exit 3"], stdin=b"z" * 3_000_000)
    assert (r.exit_code, r.stdout.strip()) == (3, "3000000")
    assert transport.run(["true"], stdin=b"never read" * 100_000).ok
    r = transport.run(["/nonexistent/command"])
    assert r.exit_code == 127 and "No such file" in r.stderr
    start = time.monotonic()
    with pytest.raises(CommandTimeout):
        transport.run(["sleep", "30"], timeout=0.5)
    assert time.monotonic() - start < 5
