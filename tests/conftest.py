"""Shared fixtures.

``testbed`` (session): 6 healthy hosts node1..node6 (2 x H100 each, toolkit + CDI, image present),
prefix ``tbt<slot letter>``, subnet 10.(120+10*slot).0.0/24 (slot: see ``testbed_slot``). Fields: ``tb.hosts`` (``.name``, ``.address``, ``.ns``, ``.profile``),
``tb.user``, ``tb.key``, ``tb.known_hosts``, ``tb.shared``, ``tb.inventory(path, runtime=, hosts=, extra_vars=)``,
faults ``tb.partition/heal/kill/stop_sshd/start_sshd/occupy_port``, ``tb.exec(host, argv)``, ``tb.processes``.
Tests that fault hosts of the session testbed must undo it (heal, start_sshd) before returning.

``make_testbed(n, profiles=None)`` (function): a dedicated testbed for tests that need special profiles
(``tests.testbed.profile(**overrides)``), torn down after the test. Each call gets its own prefix/subnet.

Integration tests never skip: if the testbed cannot be built they fail with the reason.
"""

from __future__ import annotations

import collections
import itertools
import os
import string

import pytest

from tests.testbed import Testbed, profile
from tests.testbed.core import REGISTRY
from tests.testbed.system import try_lock

SESSION_HOSTS = 6


def pytest_configure(config):
    config.addinivalue_line("markers", "integration: runs against the real multi-host testbed (root)")


# The integration modules that take longest (minutes each on a 2-core box), longest first. `make test
# TEST_WORKERS=N` runs a whole module per pytest-xdist worker (`--dist loadfile --no-loadscope-reorder`), taking
# modules in collection order: starting the long ones first keeps one of them from being left for last.
LONGEST_FIRST = ("test_oncall", "test_recovery", "test_slurm", "test_launch", "test_warm", "test_security",
                 "test_resume", "test_longrun", "test_toolkit_a", "test_toolkit_b", "test_preflight", "test_report")


def pytest_collection_modifyitems(config, items):
    for item in items:
        if "integration" in item.path.parts:
            item.add_marker(pytest.mark.integration)

    def rank(item) -> int:
        name = item.path.stem
        return LONGEST_FIRST.index(name) if name in LONGEST_FIRST else len(LONGEST_FIRST)
    items.sort(key=rank)     # stable: the tests of a module keep their order


# Seconds per integration module (setup + call + teardown of its tests), printed at the end of a run: the modules
# are what the xdist workers share out (`--dist loadfile`), so these are what LONGEST_FIRST and CI's 30 minutes
# are balanced with.
MODULE_SECONDS: collections.Counter = collections.Counter()


def pytest_runtest_logreport(report):
    path = report.nodeid.split("::", 1)[0]
    if "integration/" in path:
        MODULE_SECONDS[path.rsplit("/", 1)[-1]] += report.duration


def pytest_terminal_summary(terminalreporter):
    if MODULE_SECONDS:
        terminalreporter.write_sep("=", "seconds per integration module")
        for name, seconds in MODULE_SECONDS.most_common():
            terminalreporter.write_line(f"{seconds:8.1f}s {name}")


def _build(n, base_dir, profiles, prefix, subnet) -> Testbed:
    tb = Testbed(n, base_dir, profiles, prefix=prefix, subnet_octet=subnet)
    try:
        tb.up()
    except Exception as e:  # noqa: BLE001 - turned into a failure with the reason, never a skip
        pytest.fail(f"testbed could not be built (needs root, openssh-server, podman, runc, iproute2; "
                    f"run `make test`): {type(e).__name__}: {e}", pytrace=False)
    return tb


SLOTS = 10


@pytest.fixture(scope="session")
def testbed_slot():
    """A slot (0..9) held with a lock for the whole session, so concurrent pytest runs on one machine get
    distinct prefixes and subnets; a crashed run's slot is freed with its process, and the next run in that
    slot removes its leftovers (``Testbed.up`` cleans its prefix first)."""
    REGISTRY.mkdir(parents=True, exist_ok=True)
    for slot in range(SLOTS):
        if (fd := try_lock(REGISTRY / f"pytest-slot-{slot}.lock")) is None:
            continue
        yield slot
        os.close(fd)
        return
    pytest.fail(f"all {SLOTS} testbed slots are held by other pytest runs", pytrace=False)


@pytest.fixture(scope="session")
def testbed(tmp_path_factory, testbed_slot):
    letter = string.ascii_lowercase[testbed_slot]
    tb = _build(SESSION_HOSTS, tmp_path_factory.mktemp("testbed"), [profile(gpus=2)] * SESSION_HOSTS,
                f"tbt{letter}", 120 + 10 * testbed_slot)
    yield tb
    tb.down()


_counter = itertools.count()


@pytest.fixture
def make_testbed(tmp_path, testbed_slot):
    built: list[Testbed] = []

    def make(n: int, profiles=None) -> Testbed:
        k = next(_counter)
        suffix = string.ascii_lowercase[k // 26 % 26] + string.ascii_lowercase[k % 26]
        prefix = f"tbf{string.ascii_lowercase[testbed_slot]}{suffix}"
        tb = _build(n, tmp_path / f"testbed-{prefix}", profiles, prefix, 121 + 10 * testbed_slot + k % 9)
        built.append(tb)
        return tb

    yield make
    for tb in built:
        tb.down()
