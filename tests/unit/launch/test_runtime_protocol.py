"""``runtimes.Runtime`` is the whole port of a runtime: what it declares is what the rest of clusterctl asks of one
(docs/design.md, "a new runtime: 2 files"), and a runtime short of a member fails when it is first asked for."""
from __future__ import annotations

import sys
import types

import pytest

from clusterctl.config.inventory import Host
from clusterctl.config.spec import loads_job
from clusterctl.launch import runtimes
from clusterctl.launch.plan import build_plan

JOB = """
name: exact
nodes: 2
nproc_per_node: 1
script: train.py
"""


def _declared() -> list[str]:
    """Read off the protocol itself: its annotated attributes and its methods."""
    proto = runtimes.Runtime
    return [*proto.__annotations__, *(n for n, v in vars(proto).items() if callable(v) and not n.startswith("_"))]


def _register(monkeypatch, name: str, runtime: object) -> None:
    module = types.ModuleType(f"clusterctl_test_runtime_{name}")
    module.RUNTIME = runtime
    monkeypatch.setitem(sys.modules, module.__name__, module)
    monkeypatch.setitem(runtimes._MODULES, name, module.__name__)


def _exactly_the_protocol(base: str, drop: str = "") -> types.SimpleNamespace:
    """A runtime with exactly what ``Runtime`` declares (less ``drop``), each member ``base``'s."""
    rt = runtimes.get(base)
    return types.SimpleNamespace(**{m: getattr(rt, m) for m in _declared() if m != drop})


@pytest.mark.parametrize("name", runtimes.names())
def test_every_registered_runtime_has_every_declared_member(name):
    rt = runtimes.get(name)
    assert [m for m in _declared() if not hasattr(rt, m)] == []


@pytest.mark.parametrize("base", ["podman", "bare"])
def test_a_runtime_with_exactly_the_declared_protocol_plans_a_warm_job(monkeypatch, base):
    """``recovery: warm`` is the default: the plan asks every node's runtime for its zygote's and its warm
    attempt's argv. Those are declared, so a runtime written against the protocol alone plans (it crashed with
    an AttributeError on ``zygote_start_argv`` while the protocol left the warm path out)."""
    _register(monkeypatch, "exact", _exactly_the_protocol(base))
    spec = loads_job(JOB, "job.yaml")
    assert spec.recovery == "warm"
    hosts = [Host(name=f"n{i}", address=f"10.1.0.{i}", runtime="exact", gpus=0) for i in (1, 2)]
    plan = build_plan(spec, hosts, job_id="exact-1", attempt=0, pkg_path="/opt/clusterctl")
    assert all(n.zygote_argv and n.warm_argv for n in plan.nodes)


def test_a_runtime_short_of_a_method_fails_when_it_is_asked_for(monkeypatch):
    _register(monkeypatch, "short", _exactly_the_protocol("podman", drop="zygote_ping_argv"))
    with pytest.raises(TypeError, match="runtime 'short' .* lacks zygote_ping_argv"):
        runtimes.get("short")
