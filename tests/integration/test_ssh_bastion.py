"""SSH at scale through a real OpenSSH bastion whose sshd drops handshakes beyond 2 (``MaxStartups 2:100:2``):
every node behind it is still reached, by bounding handshakes per jump host and retrying refusals (issue 15
item 4). Without both, the same fan-out loses nodes to refusals (the bastion really drops them)."""
from __future__ import annotations

import pytest

from clusterctl.config.inventory import Host
from clusterctl.transport import ConnectOptions, fan_out, ssh
from tests.testbed import profile

N = 12


@pytest.fixture
def bastion_bed(make_testbed):
    return make_testbed(N + 1, [profile(gpus=0, image=False, sshd_max_startups="2:100:2")]
                        + [profile(gpus=0, image=False)] * N)


def _reach_all(tb, tmp_path, **opts):
    bastion = tb.hosts[0]
    cfg = tmp_path / "ssh_config"
    cfg.write_text(f"Host *\n  IdentityFile {tb.key}\n")        # the jump host's key (as OpenSSH: not -i)
    hosts = [Host(name=h.name, address=h.address, user=tb.user, key_file=str(tb.key),
                  known_hosts=str(tb.known_hosts), proxy_jump=f"{tb.user}@{bastion.address}")
             for h in tb.hosts[1:]]
    options = ConnectOptions(connect_timeout=30, ssh_config=str(cfg), known_hosts=str(tmp_path / "u"), **opts)

    def one(h):
        t = ssh.SSHTransport(h, options)
        try:
            return t.run(["hostname"], timeout=20).stdout.strip()
        finally:
            t.close()

    ssh._jump_slots.clear()
    return fan_out(hosts, one, max_workers=N, host_timeout=90)


def test_every_node_behind_a_max_startups_2_bastion_is_reached(bastion_bed, tmp_path):
    results = _reach_all(bastion_bed, tmp_path, connect_retries=0)      # defaults: jump_concurrency 8, retries
    assert [f"{r.host.name}: {r.error}" for r in results if not r.ok] == []
    assert [r.value for r in results] == [h.name for h in bastion_bed.hosts[1:]]


def test_handshakes_bounded_below_the_bastions_limit_need_no_retry(bastion_bed, tmp_path):
    """One handshake at a time: sshd may still count the previous one as unauthenticated for a moment, so 1 (not
    2) is what never meets a drop."""
    results = _reach_all(bastion_bed, tmp_path, connect_retries=0, refusal_retries=0, jump_concurrency=1)
    assert [f"{r.host.name}: {r.error}" for r in results if not r.ok] == []


def test_unbounded_and_without_retries_the_bastion_drops_nodes(bastion_bed, tmp_path):
    """The control: the bastion's MaxStartups really refuses a burst of handshakes."""
    results = _reach_all(bastion_bed, tmp_path, connect_retries=0, refusal_retries=0, jump_concurrency=N)
    failed = [r.error for r in results if not r.ok]
    assert failed, "the bastion dropped no handshake: MaxStartups 2:100:2 not in effect?"
    assert all(isinstance(e, ssh.HandshakeRefused) for e in failed), failed
