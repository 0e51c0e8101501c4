"""The module-level import graph of clusterctl is acyclic (docs/design.md), and the packages point one way, down
the job's way: cli -> usecases -> views -> supervise -> oncall -> checks/launch -> store/transport ->
config/model -> errors. config/ and model/ do no I/O: they reach no transport, store, process or network module.
"""
from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parents[2] / "clusterctl"

# a module may import modules of its own rank or lower, never higher. config and model share a rank:
# config.spec reads durations with model.budget.window_seconds, model.record holds a config.spec.JobSpec.
RANKS = {
    "clusterctl.errors": 0, "clusterctl.checkpoint": 0, "clusterctl.sampler": 0, "clusterctl.rankview": 0,
    "clusterctl.config": 1, "clusterctl.model": 1,
    "clusterctl.store": 2, "clusterctl.transport": 2, "clusterctl.slurm": 2,
    "clusterctl.checks": 3, "clusterctl.launch": 3,
    "clusterctl.oncall": 4,
    "clusterctl.supervise": 5,
    "clusterctl.views": 6,
    "clusterctl.usecases": 7, "clusterctl.fabric": 7,
    "clusterctl.cli": 8, "clusterctl.__main__": 8,
}
PURE = ("clusterctl.config", "clusterctl.model")
IO = ("clusterctl.transport", "clusterctl.store", "clusterctl.slurm", "clusterctl.launch", "clusterctl.supervise", "clusterctl.oncall",
      "clusterctl.views", "clusterctl.checks", "clusterctl.usecases", "clusterctl.cli", "clusterctl.fabric")


def _modules() -> dict[str, Path]:
    out = {}
    for p in PKG.rglob("*.py"):
        parts = p.relative_to(PKG.parent).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = p
    return out


def _is_type_checking(node: ast.If) -> bool:
    t = node.test
    return (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or \
        (isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING")


def _imports(body: list[ast.stmt], nested: bool):
    """The import statements of ``body``: top level only, or (``nested``) also those inside functions, classes
    and branches. Never those under ``if TYPE_CHECKING:`` (they do not run)."""
    for node in body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        elif isinstance(node, ast.If) and _is_type_checking(node):
            yield from _imports(node.orelse, nested)
        elif nested:
            for field in ("body", "orelse", "finalbody", "handlers"):
                inner = getattr(node, field, None)
                if isinstance(inner, list):
                    yield from _imports([n for n in inner if isinstance(n, (ast.stmt, ast.excepthandler))], nested)


def _graph(nested: bool = False) -> dict[str, set[str]]:
    """Imports run when a module is imported (top level; not ``if TYPE_CHECKING:``, not inside functions); with
    ``nested``, also the imports inside functions (run on first call)."""
    mods = _modules()

    def resolve(name: str) -> str | None:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {m: set() for m in mods}
    for m, path in mods.items():
        for node in _imports(ast.parse(path.read_text()).body, nested):
            if isinstance(node, ast.Import):
                targets = [resolve(a.name) for a in node.names]
            elif node.module and node.level == 0:
                targets = [resolve(f"{node.module}.{a.name}") or resolve(node.module) for a in node.names]
            else:
                raise AssertionError(f"{m}: a relative import (clusterctl imports absolutely)")
            graph[m] |= {t for t in targets if t and t.startswith("clusterctl") and t != m}
    return graph


def _reaches(graph: dict[str, set[str]], start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for n in graph[todo.pop()]:
            if n not in seen:
                seen.add(n)
                todo.append(n)
    return seen


def _rank(module: str) -> int | None:
    name = module
    while name:
        if name in RANKS:
            return RANKS[name]
        name = name.rpartition(".")[0]
    return None


def _under(module: str, packages) -> bool:
    return any(module == p or module.startswith(p + ".") for p in packages)


def test_no_module_imports_itself_back():
    graph = _graph()
    cycles = sorted(m for m in graph if m in _reaches(graph, m) and m != "clusterctl")
    assert cycles == []


def test_no_cycle_even_through_imports_inside_functions():
    """A lazy import is still a dependency: ``transport.base`` once imported ``transport.ssh``/``local`` inside
    ``connect()`` while both import ``base``. ``connect`` now lives in ``transport/__init__.py``; no cycle of any
    kind is allowed."""
    graph = _graph(nested=True)
    cycles = sorted(m for m in graph if m in _reaches(graph, m) and m != "clusterctl")
    assert cycles == []
    assert not {"clusterctl.transport.ssh", "clusterctl.transport.local"} & graph["clusterctl.transport.base"]


def test_every_module_has_a_rank():
    """A new package or top-level module takes its place in RANKS (and in pyproject's package list)."""
    assert sorted(m for m in _modules() if m != "clusterctl" and _rank(m) is None) == []


def test_nothing_points_back_up():
    """Counting the imports inside functions too: a lazy import is a dependency all the same."""
    graph = _graph(nested=True)
    up = sorted(f"{m} -> {t}" for m, ts in graph.items() if m != "clusterctl" for t in ts
                if t != "clusterctl" and _rank(t) > _rank(m))
    assert up == []


def test_config_and_model_do_no_io():
    graph = _graph(nested=True)
    for m in graph:
        if _under(m, PURE):
            assert not {t for t in _reaches(graph, m) if _under(t, IO)}, m


def test_layers_point_one_way():
    graph = _graph()
    sup, ops = "clusterctl.supervise.supervisor", "clusterctl.supervise.cluster_ops"
    assert ops not in _reaches(graph, sup)
    # watch.py is given its commands and connections: it knows nothing of ClusterOps, the plan or the pool
    watch_deps = _reaches(graph, "clusterctl.supervise.watch")
    assert not {ops, "clusterctl.launch.plan", "clusterctl.transport.pool"} & watch_deps
    assert not {m for m in _reaches(graph, "clusterctl.supervise.controller") if _under(m, ("clusterctl.usecases",))}
    assert not {m for m in _reaches(graph, "clusterctl.usecases") if _under(m, ("clusterctl.cli",))}
    # the supervisor's side never reaches the on-call wing (issue 36): the stacks it takes on a hang are
    # launch.stacks' (argv builders + pure parsers), which oncall's `stacks` command uses too
    nested = _graph(nested=True)
    assert not {f"{m} -> {t}" for m in nested if _under(m, ("clusterctl.supervise",))
                for t in _reaches(nested, m) if _under(t, ("clusterctl.oncall",))}
    assert not {m for m in _reaches(graph, "clusterctl.launch.plan") if m.startswith("clusterctl.checks")}
    for pure in ("clusterctl.launch.plan", "clusterctl.config.spec", sup, "clusterctl.model.causes",
                 "clusterctl.checks.model", "clusterctl.checks.registry", "clusterctl.config.hostport",
                 "clusterctl.supervise.observe"):
        assert not {m for m in _reaches(graph, pure) if m.startswith("clusterctl.transport")}, pure


def test_the_views_read_values_not_the_loop():
    """The views show what the supervisor decided from the words in ``model/`` (``model.verdicts``: Verdict,
    Observation, Decision, NodeError); they never import ``supervise`` (its loop, its cluster side)."""
    graph = _graph(nested=True)
    found = sorted(f"{m} -> {t}" for m, ts in graph.items() if _under(m, ("clusterctl.views",)) for t in ts
                   if _under(t, ("clusterctl.supervise",)))
    assert found == []
    assert "clusterctl.model.verdicts" in graph["clusterctl.views.status"]


STORE_WRITES = {"create_job", "set_state", "update_job", "start_attempt", "end_attempt", "set_node", "add_event",
                "delete_job", "cordon", "uncordon", "claim_supervisor", "heartbeat", "release_supervisor"}


def test_only_the_ledger_writes_the_lifecycle():
    """A call of a ``Store`` write method outside ``clusterctl/store/`` would be a second writer of the lifecycle
    (issue 25): every one goes through ``store.ledger.Ledger``. A store is always called ``store`` here
    (``store``, ``self.store``, ``ws.store``), so the receiver's name finds them."""
    def is_store(receiver: ast.expr) -> bool:
        return (isinstance(receiver, ast.Name) and receiver.id == "store") or \
            (isinstance(receiver, ast.Attribute) and receiver.attr == "store")

    found, calls = [], 0
    for mod, path in _modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and is_store(node.func.value):
                calls += 1
                if node.func.attr in STORE_WRITES and not mod.startswith("clusterctl.store"):
                    found.append(f"{mod}:{node.lineno} store.{node.func.attr}()")
    assert calls > 50          # the store's readers are found: the rule sees what it must
    assert found == []


def test_the_cli_reaches_the_store_and_the_supervisor_only_through_the_use_cases():
    """cli/: flags -> a request -> one use case (``clusterctl.usecases``) -> text and an exit code. No command opens
    the store, resolves paths, writes the ledger or drives the controller itself (issue 25 step 3); the store's
    types (JobState) may be named."""
    graph = _graph(nested=True)
    banned = ("clusterctl.supervise", "clusterctl.store.paths", "clusterctl.store.ledger")
    found = sorted(f"{m} -> {t}" for m, ts in graph.items() if _under(m, ("clusterctl.cli",)) for t in ts
                   if _under(t, banned))
    assert found == []
    loops = [f"{m}:{n.lineno}" for m, path in _modules().items() if _under(m, ("clusterctl.cli",))
             for n in ast.walk(ast.parse(path.read_text()))
             if isinstance(n, ast.While) and isinstance(n.test, ast.Constant) and n.test.value is True]
    assert loops == []          # following and watching poll in the use cases; cli renders what they hand it


def test_the_use_cases_mirror_the_cli():
    """One use-case module per command group (issue 36): ``cli/<group>.py`` calls ``usecases/<group>.py`` (plus
    ``usecases.base``, the workspace, and ``usecases.lifecycle``, which ``validate`` and ``sbatch-run`` share), and
    no command keeps its use case: no cli module connects to a host, runs a check, a remote command or a Slurm
    command itself (the work of ``preflight``, ``exec``, ``shell``, ``stacks`` and ``sbatch`` was in cli/)."""
    graph = _graph(nested=True)
    mods = _modules()
    groups = sorted(m.rpartition(".")[2] for m in mods if _under(m, ("clusterctl.cli",))
                    and m.rpartition(".")[2] not in ("cli", "base", "__main__"))
    assert groups and [g for g in groups if f"clusterctl.usecases.{g}" not in mods] == []
    for g in groups:
        used = {t for t in graph[f"clusterctl.cli.{g}"] if _under(t, ("clusterctl.usecases",))}
        assert f"clusterctl.usecases.{g}" in used, g
        assert used <= {f"clusterctl.usecases.{g}", "clusterctl.usecases.base", "clusterctl.usecases.lifecycle"}, g
    work = ("clusterctl.transport", "clusterctl.checks.preflight", "clusterctl.oncall.jobnodes",
            "clusterctl.oncall.shell", "clusterctl.slurm.sbatch", "clusterctl.slurm.allocation")
    allowed = {"clusterctl.cli.base": {"clusterctl.transport", "clusterctl.slurm.allocation"}}  # ConnectOptions, -i
    found = sorted(f"{m} -> {t}" for m, ts in graph.items() if _under(m, ("clusterctl.cli",)) for t in ts
                   if _under(t, work) and not _under(t, tuple(allowed.get(m, ()))))
    assert found == []


def test_only_the_runtimes_compare_a_runtimes_name():
    """Every difference between docker, podman and bare lives in its runtime module (``launch/runtimes/``): a
    new runtime is one module there plus its name in ``config.inventory.RUNTIMES``. The one exception is the
    container engine's own preflight (``checks.runtime``), which parses `docker info` / `podman info` (a
    ``docker`` command may be podman) and words its hints for each."""
    names = {"docker", "podman", "bare"}
    allowed = ("clusterctl.launch.runtimes", "clusterctl.checks.runtime", "clusterctl.config.inventory")
    found = []
    for mod, path in _modules().items():
        if _under(mod, allowed):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Compare) and any(isinstance(c, ast.Constant) and c.value in names
                                                     for c in [node.left, *node.comparators]):
                found.append(f"{mod}:{node.lineno}")
    assert found == []


def test_event_kinds_are_compared_with_the_enum():
    """Readers compare an event's kind with ``model.events.EventKind`` (``e.kind == EventKind.END``), never with
    its stored string: a renamed or mistyped kind is then an AttributeError, not a comparison that is always false."""
    from clusterctl.model.events import EventKind

    stored = {k.value for k in EventKind}

    def literals(node: ast.expr) -> list[str]:
        items = node.elts if isinstance(node, (ast.Tuple, ast.List, ast.Set)) else [node]
        return [i.value for i in items if isinstance(i, ast.Constant) and i.value in stored]

    found = []
    for mod, path in _modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Compare):
                sides = [node.left, *node.comparators]
                if any(isinstance(x, ast.Attribute) and x.attr == "kind" for x in sides) and \
                        any(literals(x) for x in sides):
                    found.append(f"{mod}:{node.lineno}")
    assert found == []


def test_the_supervisors_port_is_called_not_probed():
    """``NodeOps`` declares everything the loop uses (issue 36): neither the supervisor nor the controller that
    drives it asks ``ops`` whether it has a member (``getattr``/``hasattr`` on ``ops``/``self.ops``); a cluster
    that lacks a capability answers None."""
    def is_ops(x: ast.expr) -> bool:
        return (isinstance(x, ast.Name) and x.id == "ops") or (isinstance(x, ast.Attribute) and x.attr == "ops")

    found = [f"{mod}:{n.lineno}" for mod, path in _modules().items()
             for n in ast.walk(ast.parse(path.read_text()))
             if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in ("getattr", "hasattr")
             and n.args and is_ops(n.args[0])]
    assert found == []      # anywhere: reconcile asked ``getattr(ops, "hosts")`` (now ``NodeOps.known``)


def test_cluster_ops_is_plumbing_start_stop_reachability_and_checkpoint_lookup():
    """Issue 36's target: ``supervise/cluster_ops.py`` at most 350 lines (it was 750, the most-changed file): the
    probe round is ``supervise.probe``, the diagnoses ``supervise.diagnose``, recovery ``supervise.recovery``, and
    it writes nothing (no ledger: ``start`` returns rows, the supervisor's transaction writes them)."""
    path = PKG / "supervise" / "cluster_ops.py"
    assert len(path.read_text().splitlines()) <= 350
    graph = _graph(nested=True)
    assert "clusterctl.store.ledger" not in graph["clusterctl.supervise.cluster_ops"]
    assert not {m for m in graph["clusterctl.supervise.cluster_ops"] if _under(m, ("clusterctl.supervise.recovery",))
                and m != "clusterctl.supervise.recovery"}      # no strategy by name: the registry finds them


def test_recovery_strategies_come_from_one_registry_and_the_schema_offers_its_names():
    """A recovery strategy is one module, ``supervise/recovery/<name>.py`` with a ``STRATEGY``, plus one registry
    line, its name in ``config.spec.RECOVERIES``; the job schema's ``recovery:`` choices (pydantic's and the
    editors' JSON Schema) are those names, the first the default. Dropping one is its module and its line."""
    from clusterctl.config.spec import RECOVERIES, JobSpec, json_schema
    from clusterctl.supervise import recovery

    modules = sorted(m.rpartition(".")[2] for m in _modules() if m.startswith("clusterctl.supervise.recovery."))
    assert modules == sorted(RECOVERIES) and len(set(RECOVERIES)) == len(RECOVERIES)
    for name in RECOVERIES:
        strategy = recovery.get(name)
        assert callable(strategy.start) and callable(strategy.teardown), name
    for schema in (JobSpec.model_json_schema(), json_schema()):
        prop = schema["properties"]["recovery"]
        assert (prop["enum"], prop["default"]) == (list(RECOVERIES), RECOVERIES[0])
    # nothing else names a strategy's module: the registry's name finds it (supervise.recovery.get)
    found = sorted(f"{m} -> {t}" for m, ts in _graph(nested=True).items() for t in ts
                   if _under(t, ("clusterctl.supervise.recovery",)) and t != "clusterctl.supervise.recovery"
                   and not _under(m, ("clusterctl.supervise.recovery",)))
    assert found == []


def test_pyprojects_package_list_names_every_package():
    """pyproject.toml lists its packages explicitly: a new package missing there is missing from the wheel."""
    import tomllib

    listed = set(tomllib.loads((PKG.parent / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {".".join(p.parent.relative_to(PKG.parent).parts) for p in PKG.rglob("__init__.py")}
    assert found - listed == set()


def test_dropping_warm_recovery_is_its_module_and_its_registry_line(tmp_path):
    """Issue 36's target, done in a copy of the package: ``supervise/recovery/warm.py`` deleted and ``"warm"``
    taken out of ``RECOVERIES``, every module still imports, the schema offers ``cold`` alone (its default), a job
    that asks for warm is refused, and a plan gives every node its cold path."""
    import shutil
    import subprocess
    import sys

    copy = tmp_path / "clusterctl"
    shutil.copytree(PKG, copy, ignore=shutil.ignore_patterns("__pycache__"))
    (copy / "supervise" / "recovery" / "warm.py").unlink()
    spec = copy / "config" / "spec.py"
    text = spec.read_text()
    assert 'RECOVERIES = ("warm", "cold")' in text
    spec.write_text(text.replace('RECOVERIES = ("warm", "cold")', 'RECOVERIES = ("cold",)'))
    script = r'''
import importlib, pkgutil, clusterctl
for m in pkgutil.walk_packages(clusterctl.__path__, "clusterctl."):
    if not m.name.endswith("__main__"):      # a command line: it runs when imported
        importlib.import_module(m.name)
from clusterctl.config.inventory import Host
from clusterctl.config.spec import JobSpec, loads_job
from clusterctl.errors import InputError
from clusterctl.launch.plan import build_plan
from clusterctl.supervise import recovery
prop = JobSpec.model_json_schema()["properties"]["recovery"]
assert prop.get("enum", [prop.get("const")]) == ["cold"] and prop["default"] == "cold", prop   # one name: "const"
job = "name: j\nimage: img\nnodes: 2\nnproc_per_node: 1\nscript: t.py\n"
spec = loads_job(job, "job.yaml")
assert spec.recovery == "cold" and recovery.get("cold") is not None
try:
    loads_job(job + "recovery: warm\n", "job.yaml")
    raise SystemExit("recovery: warm was accepted")
except InputError as e:
    assert "recovery" in str(e), e
hosts = [Host("a", "10.0.0.1", runtime="podman"), Host("b", "10.0.0.2", runtime="podman")]
plan = build_plan(spec, hosts, job_id="j-1", attempt=2, rdzv_host=hosts[0])
assert all(not n.warm_argv and not n.zygote_argv and n.cold_why for n in plan.nodes)
print("ok")
'''
    r = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert (r.returncode, r.stdout.strip()) == (0, "ok"), r.stderr[-3000:]
