"""Shared fixtures.

``testbed`` (session): 6 healthy hosts node1..node6 (2 x H100 each, toolkit + CDI, image present),
prefix ``tbt``, subnet 10.78.0.0/24. Fields: ``tb.hosts`` (``.name``, ``.address``, ``.ns``, ``.profile``),
``tb.user``, ``tb.key``, ``tb.known_hosts``, ``tb.shared``, ``tb.inventory(path, runtime=, hosts=, extra_vars=)``,
faults ``tb.partition/heal/kill/stop_sshd/start_sshd/occupy_port``, ``tb.exec(host, argv)``, ``tb.processes``.
Tests that fault hosts of the session testbed must undo it (heal, start_sshd) before returning.

``make_testbed(n, profiles=None)`` (function): a dedicated testbed for tests that need special profiles
(``tests.testbed.profile(**overrides)``), torn down after the test. Each call gets its own prefix/subnet.

Integration tests never skip: if the testbed cannot be built they fail with the reason.
"""

from __future__ import annotations

import itertools

import pytest

from tests.testbed import Testbed, profile

SESSION_HOSTS = 6


def pytest_configure(config):
    config.addinivalue_line("markers", "integration: runs against the real multi-host testbed (root)")


def pytest_collection_modifyitems(config, items):
    for item in items:
        if "integration" in item.path.parts:
            item.add_marker(pytest.mark.integration)


def _build(n, base_dir, profiles, prefix, subnet) -> Testbed:
    tb = Testbed(n, base_dir, profiles, prefix=prefix, subnet_octet=subnet)
    try:
        tb.up()
    except Exception as e:  # noqa: BLE001 - turned into a failure with the reason, never a skip
        pytest.fail(f"testbed could not be built (needs root, openssh-server, podman, runc, iproute2; "
                    f"run `make test`): {type(e).__name__}: {e}", pytrace=False)
    return tb


@pytest.fixture(scope="session")
def testbed(tmp_path_factory):
    tb = _build(SESSION_HOSTS, tmp_path_factory.mktemp("testbed"), [profile(gpus=2)] * SESSION_HOSTS,
                "tbt", 78)
    yield tb
    tb.down()


_counter = itertools.count(1)


@pytest.fixture
def make_testbed(tmp_path):
    built: list[Testbed] = []

    def make(n: int, profiles=None) -> Testbed:
        k = next(_counter)
        tb = _build(n, tmp_path / f"testbed{k}", profiles, f"tbf{k}", 100 + k % 100)
        built.append(tb)
        return tb

    yield make
    for tb in built:
        tb.down()
