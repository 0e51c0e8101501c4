"""The check registry: every check and probe registered once, the sets derived from it, and a new check needing
one registration (a check module's records plus a line in registry.py)."""
from __future__ import annotations

from dataclasses import replace

from clusterctl.checks import registry
from clusterctl.checks.job import PreflightJob, PreflightOptions
from clusterctl.checks.model import Check, HostProbe, Probe, Section, section
from clusterctl.checks.preflight import evaluate_host
from clusterctl.checks.probe import build_probe_script, wanted_sections
from clusterctl.checks.results import passed
from clusterctl.config.inventory import Host


def test_ids_and_probe_names_are_unique_and_every_need_has_a_probe():
    ids = [c.id for c in registry.CHECKS]
    names = [p.name for p in registry.PROBES]
    assert len(ids) == len(set(ids)) and len(names) == len(set(names))
    assert {n for c in registry.CHECKS for n in c.needs} <= set(names)
    assert registry.HOST_CHECKS[0] == "ssh"
    assert all(c.fn is not None for c in registry.CHECKS if c.kind != "cluster")
    assert all(c.fn is None for c in registry.CHECKS if c.kind == "cluster")


def test_the_sets_are_built_from_the_records():
    assert registry.LAUNCH_CHECKS == {"ssh", "gpu_driver", "gpu_count", "gpu_health", "container_runtime",
                                      "nvidia_toolkit", "image", "ports", "interface", "torchrun", "script",
                                      "rendezvous_exposure"}
    assert registry.ALL_CHECKS == set(registry.HOST_CHECKS + registry.ENTRY_CHECKS + registry.CLUSTER_CHECKS)
    assert registry.LABELS["interface"] == "nic" and "hostnames" not in registry.LABELS


def test_only_the_probes_the_selected_checks_need_run_where_they_apply():
    gpu = Host(name="g", address="10.0.0.1", runtime="docker", gpus=8)
    cpu = Host(name="c", address="c.example", runtime="bare", gpus=0)
    only = PreflightOptions(only=frozenset({"ssh", "disk"}))
    job = PreflightJob(checkpoint_dir="/ck")
    assert wanted_sections(gpu, job, only) == {"runtime_info", "df_checkpoint", "df_runtime"}
    assert wanted_sections(cpu, job, only) == {"df_checkpoint"}
    everything = wanted_sections(cpu, None, PreflightOptions())
    assert "nvidia_smi" not in everything and "runtime_info" not in everything and "getent" in everything


def test_a_new_check_is_one_record_and_one_probe(monkeypatch):
    def check_motd(p):
        return passed("motd", p.sections["motd"].output)

    probe = Probe("motd", lambda host, job, o: section("motd", "cat /etc/motd"))
    monkeypatch.setattr(registry, "CHECKS", registry.CHECKS + (Check("motd", "host", check_motd, ("motd",)),))
    monkeypatch.setattr(registry, "PROBES", registry.PROBES + (probe,))
    host = Host(name="n", address="10.0.0.1", runtime="bare", gpus=0)
    opts = replace(PreflightOptions(), only=frozenset({"ssh", "motd"}))
    script = build_probe_script(host, None, opts)
    assert "b motd; cat /etc/motd; e motd $?" in script and "nvidia" not in script
    checks = evaluate_host(HostProbe(host, None, opts, {"motd": Section("welcome", 0)}))
    assert checks["motd"].status == "pass" and checks["motd"].detail == "welcome"


# ------------------------------------------------------------------------------------------- phase 2, pure
def _probes(hosts, *, nonce_rc=0):
    from clusterctl.checks.results import failed, passed

    probes = {h.name: HostProbe(h, None, PreflightOptions(), {"nonce_write": Section("", nonce_rc)}) for h in hosts}
    checks = {h.name: {"ssh": passed("ssh", "ok"), "ports": passed("ports", "free")} for h in hosts}
    return probes, checks, failed


def test_plan_cluster_decides_who_runs_what_from_phase_one_alone():
    from clusterctl.checks.preflight import judge_cluster, plan_cluster

    hosts = [Host(name=f"n{i}", address=f"10.0.0.{i}") for i in (1, 2, 3)]
    job = PreflightJob(checkpoint_dir="/ck")
    probes, checks, failed = _probes(hosts)
    plan = plan_cluster(hosts, probes, checks, job, "n0nce", share=True, rdzv_wanted=True)
    assert plan.listen and plan.read_nonce == "/ck/.clusterctl-preflight-n0nce"
    assert [h.name for h in plan.targets] == ["n1", "n2", "n3"]
    assert "python3" in plan.script(hosts[0], PreflightOptions()) and "b connect" in plan.script(hosts[1],
                                                                                                PreflightOptions())
    checks["n1"]["ports"] = failed("ports", "busy", "free it")           # the rendezvous port is taken: no listener
    plan = plan_cluster(hosts, probes, checks, job, "n0nce", share=True, rdzv_wanted=True)
    assert not plan.listen and [h.name for h in plan.targets] == ["n2", "n3"]   # the peers still read the nonce
    verdicts = judge_cluster(plan, job, hosts, "n0nce", {}, None, PreflightOptions())
    assert [(c.id, c.status, c.detail) for c in verdicts][0] == (
        "rendezvous_reachable", "skip", "port 29400 is in use on n1 (see ports)")
    del probes["n1"]                                                      # the rendezvous host did not answer
    plan = plan_cluster(hosts, probes, checks, job, "n0nce", share=True, rdzv_wanted=True)
    assert (plan.rdzv_ok, plan.listen, plan.read_nonce, plan.targets) == (False, False, None, [])
    assert {c.id: c.detail for c in judge_cluster(plan, job, hosts, "n0nce", {}, None, PreflightOptions())} == {
        "rendezvous_reachable": "rendezvous host n1 unreachable", "shared_storage": "n1 unreachable"}
