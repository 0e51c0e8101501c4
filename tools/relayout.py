#!/usr/bin/env python3
"""Issue 25 step 1: move clusterctl's flat modules into packages along the pipeline, mechanically.

Run from anywhere inside the repository (``python tools/relayout.py``; ``--dry-run`` prints what it would do).
It works on whatever tree it finds, so it can run again after other branches are merged:

1. relative imports under ``clusterctl/`` become absolute (resolved at the file's old place);
2. ``git mv`` of every module in ``MODULES`` (and of the unit tests in ``TESTS``) whose old file is still there;
3. every reference to a moved module is rewritten in ``REWRITE_ROOTS``: ``from clusterctl import x``,
   dotted names (``clusterctl.x``, ``clusterctl.x.attr`` in imports, strings, monkeypatch targets, ``-m``),
   paths (``clusterctl/x.py``, ``tests/unit/test_x.py``);
4. the few content edits a move needs (``PATCHES``: ``python -m clusterctl.supervise`` as the supervisor's entry
   point, liveness accepting both command lines), new ``__init__.py``/``__main__.py`` files, pyproject's package
   list, README's Layout block, the import-graph test;
5. a report: modules and unit tests that are in no table (left where they are; their imports of moved modules
   are rewritten all the same), and patches whose anchor was not found.

Deterministic and idempotent: a second run moves nothing and rewrites nothing (no new name contains an old one).
Moves only: no module's contents are split here.
"""
from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent

# old module -> new module. A package (runtimes) moves as a folder, with whatever files it holds.
MODULES: dict[str, str] = {
    # config/: what the user wrote, read and checked (pure)
    "clusterctl.yamlfile": "clusterctl.config.yamlfile",
    "clusterctl.inventory": "clusterctl.config.inventory",
    "clusterctl.hostpattern": "clusterctl.config.hostpattern",
    "clusterctl.hostport": "clusterctl.config.hostport",
    "clusterctl.spec": "clusterctl.config.spec",
    "clusterctl.ids": "clusterctl.config.ids",
    # model/: the job's lifecycle values (pure)
    "clusterctl.budget": "clusterctl.model.budget",
    "clusterctl.causes": "clusterctl.model.causes",
    "clusterctl.record": "clusterctl.model.record",
    # launch/: the plan and the runtimes that carry it out
    "clusterctl.plan": "clusterctl.launch.plan",
    "clusterctl.runtimes": "clusterctl.launch.runtimes",
    # supervise/: the loop and what feeds it
    "clusterctl.supervisor": "clusterctl.supervise.supervisor",
    "clusterctl.observe": "clusterctl.supervise.observe",
    "clusterctl.watch": "clusterctl.supervise.watch",
    "clusterctl.heartbeat": "clusterctl.supervise.heartbeat",
    "clusterctl.reconcile": "clusterctl.supervise.reconcile",
    "clusterctl.notify": "clusterctl.supervise.notify",
    "clusterctl.controller": "clusterctl.supervise.controller",
    "clusterctl.launcher": "clusterctl.supervise.cluster_ops",      # ClusterOps (the NodeOps adapter) + LogSink
    # store/: what is kept on the controller
    "clusterctl.state": "clusterctl.store.state",
    "clusterctl.paths": "clusterctl.store.paths",
    # views/: what the read-only commands show
    "clusterctl.status": "clusterctl.views.status",
    "clusterctl.history": "clusterctl.views.history",
    "clusterctl.nodehealth": "clusterctl.views.nodes",
    "clusterctl.logs": "clusterctl.views.logs",
    "clusterctl.columns": "clusterctl.views.columns",
    # oncall/: commands run on a job's nodes
    "clusterctl.remote_exec": "clusterctl.oncall.remote_exec",
    "clusterctl.shell": "clusterctl.oncall.shell",
    "clusterctl.stacks": "clusterctl.oncall.stacks",
    "clusterctl.jobnodes": "clusterctl.oncall.jobnodes",
}
# file moves that keep the import path (cli.py becomes a package that later holds one module per command group)
FILE_MOVES: dict[str, str] = {"clusterctl/cli.py": "clusterctl/cli/__init__.py"}
# stay where they are: public import paths of training scripts and nodes, the exception tree, the use cases
KEEP = {"clusterctl", "clusterctl.checkpoint", "clusterctl.sampler", "clusterctl.fabric", "clusterctl.errors",
        "clusterctl.jobs", "clusterctl.cli"}
KEEP_PACKAGES = {"checks", "transport"}

PACKAGE_DOCS = {
    "config": "What the user wrote: YAML with lines, the inventory, host patterns, the job spec, ids (pure).",
    "model": "The job's lifecycle values: restart budgets, causes of an end, the job record (pure).",
    "launch": "What starts on the nodes: the pure launch plan and the runtimes (docker, podman, bare).",
    "supervise": "The supervisor: the loop and classify, ClusterOps (the node adapter) and its log sink, "
                 "observations, watches, heartbeat limits, reconcile, notifications, and the detached process "
                 "(``python -m clusterctl.supervise``).",
    "store": "What is kept on the controller: the SQLite store and the private state dir.",
    "views": "What the read-only commands show: status, history, nodes, logs, 80-column tables.",
    "oncall": "Commands on a job's nodes: exec, shell, stacks, and where a job runs now.",
}

SUPERVISE_MAIN = '''"""``python -m clusterctl.supervise [--state-dir DIR] JOB_ID [--adopt]``: the detached supervisor of one job.

``supervise.controller.spawn_supervisor`` starts it (own session, output to the job's supervisor.log). The command
line of the release before, ``clusterctl --state-dir DIR _supervise JOB_ID``, runs the same body (cli); both are
recognised as a job's supervisor (``controller.live_supervisor``). Exit 0 when the job succeeded, else 1; 2 and
the error's text for a user error (as the CLI).
"""
from __future__ import annotations

import argparse
import logging
import os
import sys


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m clusterctl.supervise")
    p.add_argument("--state-dir", default=os.environ.get("CLUSTERCTL_STATE_DIR"))
    p.add_argument("--debug", action="store_true")
    p.add_argument("job_id")
    p.add_argument("--adopt", action="store_true")
    args = p.parse_args(argv)
    # paramiko logs a failed handshake with its traceback; the failure reaches the job's events as a value
    logging.getLogger("paramiko").setLevel(logging.DEBUG if args.debug else logging.CRITICAL + 1)
    from clusterctl.errors import ClusterctlError
    from clusterctl.store import paths
    from clusterctl.store.state import JobState
    from clusterctl.supervise import controller
    from clusterctl.transport import ConnectOptions

    try:
        # never accept new host keys (issue 11): launch/resume recorded them before the supervisor started
        state = controller.supervise(paths.state_dir(args.state_dir), args.job_id,
                                     ConnectOptions(accept_new_host_keys=False), adopt=args.adopt,
                                     echo=lambda m: print(m, flush=True))
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr, flush=True)
        return 130
    except ClusterctlError as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
        return e.exit_code
    except Exception as e:  # noqa: BLE001 - as the CLI: one line, the traceback only with --debug
        if args.debug:
            import traceback

            traceback.print_exc()
        print(f"internal error: {e.__class__.__name__}: {e}", file=sys.stderr, flush=True)
        return 1
    return 0 if state == JobState.SUCCEEDED else 1


if __name__ == "__main__":
    sys.exit(main())
'''
CLI_MAIN = '''"""``python -m clusterctl.cli``: the same as the ``clusterctl`` console script."""
from clusterctl.cli import main

main()
'''

# unit tests: old file under tests/unit -> new path under tests/ (named after behaviour where a file was named
# after a ticket). Shared fakes become the package tests/fakes.
TESTS: dict[str, str] = {
    "test_inventory.py": "unit/config/test_inventory.py",
    "test_spec.py": "unit/config/test_spec.py",
    "test_hostport.py": "unit/config/test_hostport.py",
    "test_fuzz_loaders.py": "unit/config/test_fuzz_loaders.py",
    "test_budget.py": "unit/model/test_budget.py",
    "test_longrun_unit.py": "unit/model/test_budget_long_runs.py",
    "test_causes.py": "unit/model/test_causes.py",
    "test_checks_entry.py": "unit/checks/test_entry.py",
    "test_checks_parsers.py": "unit/checks/test_parsers.py",
    "test_checks_preflight.py": "unit/checks/test_preflight.py",
    "test_checks_registry.py": "unit/checks/test_registry.py",
    "test_checks_script.py": "unit/checks/test_probe_script.py",
    "test_plan.py": "unit/launch/test_plan.py",
    "test_gpu_flags.py": "unit/launch/test_gpu_flags.py",
    "test_container_select.py": "unit/launch/test_container_select.py",
    "test_docker_runtime.py": "unit/launch/test_docker_runtime.py",
    "test_runtime_scripts.py": "unit/launch/test_runtime_scripts.py",
    "test_node_scripts_security.py": "unit/launch/test_node_scripts_security.py",
    "test_supervisor.py": "unit/supervise/test_supervisor.py",
    "test_supervisor_spawn.py": "unit/supervise/test_supervisor_spawn.py",
    "test_launcher.py": "unit/supervise/test_log_copy_and_root_cause.py",
    "test_launcher_ops.py": "unit/supervise/test_cluster_ops.py",
    "test_log_sink.py": "unit/supervise/test_log_sink.py",
    "test_observe.py": "unit/supervise/test_observe.py",
    "test_watch.py": "unit/supervise/test_watch.py",
    "test_heartbeat.py": "unit/supervise/test_heartbeat.py",
    "test_notify.py": "unit/supervise/test_notify.py",
    "test_controller_files.py": "unit/supervise/test_controller_files.py",
    "test_scale_unit.py": "unit/supervise/test_flat_cost_per_node.py",
    "test_state.py": "unit/store/test_state.py",
    "test_history.py": "unit/views/test_history.py",
    "test_nodes.py": "unit/views/test_nodes.py",
    "test_oncall_unit.py": "unit/oncall/test_oncall_truth.py",
    "test_stacks.py": "unit/oncall/test_stacks.py",
    "test_toolkit_a_unit.py": "unit/oncall/test_exec_limit_stacks.py",
    "test_fanout.py": "unit/transport/test_fanout.py",
    "test_pool.py": "unit/transport/test_pool.py",
    "test_ssh_scale.py": "unit/transport/test_ssh_scale.py",
    "test_ssh_security.py": "unit/transport/test_ssh_security.py",
    "test_cli_newuser.py": "unit/cli/test_first_use.py",
    "test_checkpoint.py": "unit/training/test_checkpoint.py",
    "test_sampler.py": "unit/training/test_sampler.py",
    "test_training_state.py": "unit/training/test_training_state.py",
    "test_quickstart_resume_at_end.py": "unit/training/test_resume_at_final_step.py",
    "test_checks_fakes.py": "fakes/checks.py",
    "sshserver.py": "fakes/sshserver.py",
}
TESTS_KEEP = {"conftest.py", "__init__.py", "test_import_graph.py", "test_jobs.py", "test_testbed_cleanup.py"}

REWRITE_ROOTS = ["clusterctl", "tests", "bench", "examples", "templates", "docs", "tools", "README.md",
                 "Makefile", "pyproject.toml"]
SKIP = ("tests/fixtures/",)           # golden fixtures stay byte-identical
TEXT_SUFFIXES = {".py", ".md", ".toml", ".txt", ".sh", ".yaml", ".yml", ".cfg", ".ini", ".j2", ""}

# (file, old text, new text): content edits the moves need. Applied when old is there; a missing anchor is
# reported unless new is already there.
PATCHES: list[tuple[str, str, str]] = [
    ("clusterctl/supervise/controller.py",
     'argv = [sys.executable, "-m", "clusterctl.cli", "--state-dir", str(root)]',
     'argv = [sys.executable, "-m", "clusterctl.supervise", "--state-dir", str(root)]'),
    ("clusterctl/supervise/controller.py",
     'argv += ["_supervise", job_id] + (["--adopt"] if adopt else [])',
     'argv += [job_id] + (["--adopt"] if adopt else [])'),
    ("clusterctl/supervise/controller.py",
     'return b"_supervise" in cmd and job_id.encode() in cmd',
     '# `python -m clusterctl.supervise JOB_ID`, or `clusterctl _supervise JOB_ID` (started before issue 25)\n'
     '    return bool({b"clusterctl.supervise", b"_supervise"} & set(cmd)) and job_id.encode() in cmd'),
    ("clusterctl/supervise/controller.py",
     "records the job and starts ``clusterctl _supervise JOB_ID`` here",
     "records the job and starts ``python -m clusterctl.supervise JOB_ID`` here"),
    ("clusterctl/supervise/controller.py",
     '"""Start ``clusterctl _supervise`` detached:',
     '"""Start ``python -m clusterctl.supervise`` detached:'),
    ("clusterctl/supervise/controller.py",
     '"""The body of ``clusterctl _supervise``: claim the job, beat, run the loop, release."""',
     '"""The supervisor\'s body (``python -m clusterctl.supervise``): claim the job, beat, run the loop, release."""'),
    ("clusterctl/launch/runtimes/bare.py",
     "from clusterctl.launch.runtimes import (APPLY_ENV_AND_EXEC, DEFAULT_JOBS_ROOT, ENV_SCRIPT_VAR, LABEL_ATTEMPT, "
     "LABEL_JOB_ID,\n                                        LIB_DIR_VAR, ",
     "from clusterctl.launch.runtimes import (APPLY_ENV_AND_EXEC, DEFAULT_JOBS_ROOT, ENV_SCRIPT_VAR, LABEL_ATTEMPT,\n"
     "                                        LABEL_JOB_ID, LIB_DIR_VAR, "),
    ("tests/unit/supervise/test_supervisor_spawn.py",
     'assert "_supervise" in argv and "job-1" in argv',
     'assert argv[1:3] == ["-m", "clusterctl.supervise"] and "job-1" in argv'),
    ("tests/testbed/system.py",
     '''        if "_supervise" not in argv or "--state-dir" not in argv:
            continue
        state_dir = argv[argv.index("--state-dir") + 1]
        job_id = argv[argv.index("_supervise") + 1] if argv.index("_supervise") + 1 < len(argv) else ""''',
     '''        # `python -m clusterctl.supervise --state-dir DIR JOB_ID`, or `clusterctl ... _supervise JOB_ID`
        mark = next((m for m in ("clusterctl.supervise", "_supervise") if m in argv), None)
        if mark is None or "--state-dir" not in argv:
            continue
        state_dir = argv[argv.index("--state-dir") + 1]
        after = [a for a in argv[argv.index(mark) + 1:] if not a.startswith("-")]
        job_id = (after[1] if mark == "clusterctl.supervise" and len(after) > 1 else after[0]) if after else ""'''),
    ("tests/integration/test_security.py",
     'b"_supervise" in Path(f"/proc/{pid}/cmdline").read_bytes()',
     'b"supervise" in Path(f"/proc/{pid}/cmdline").read_bytes()'),
]

LAYOUT_README = """clusterctl/         the job's way, top to bottom; each package's __init__.py says what it holds
  cli/              the only printer/exiter (click + rich): flags -> a request -> one use case -> text/exit code
  jobs.py           the job use cases (launch, resume, stop, status, attach): the "before we start" policy
  errors.py         one exception tree (UserError -> exit 2)
  config/           what the user wrote (pure): yamlfile (YAML with lines), inventory (-> frozen Hosts),
                    hostpattern (--limit), spec (the job file, FILE:LINE errors), ids, hostport
  model/            the lifecycle's values (pure): budget (restart windows, backoff), causes (why an attempt
                    ended, from what a node left), record (the job as recorded: spec + hosts + choices)
  checks/           preflight: one batched probe script per host + pure parsers with golden fixtures; every
                    check and probe registered once as data (checks/model.py, checks/registry.py)
  launch/           plan (pure (spec, hosts, attempt) -> LaunchPlan, printed by --dry-run); runtimes/ (docker,
                    podman, bare: pure argv builders and status parsers)
  supervise/        supervisor (pure classify + the loop over a NodeOps port), cluster_ops (ClusterOps: the NodeOps
                    adapter applying plans over transports, rolling back partial starts; LogSink), observe (pure),
                    watch (watches and log followers), heartbeat (node watch limits), reconcile, notify,
                    controller (the detached process: spawn, body, liveness; `python -m clusterctl.supervise`)
  store/            state (SQLite WAL: jobs, attempts, nodes, events; the TRANSITIONS table), paths (state dir)
  views/            status, history (which jobs `status` lists), nodes (per-host failures, cordons), logs, columns
  oncall/           remote_exec (`exec`), shell, stacks (py-spy on every rank), jobnodes (where a job runs now)
  transport/        Transport protocol, connect(); ssh.py (paramiko), local.py; fanout.py (bounded pool, deadlines,
                    errors as values); pool.py (one kept connection per node); streams.py (followers on one thread)
  checkpoint.py     the checkpoint protocol + capture/restore of the training state (stdlib; torch lazily; shipped)
  sampler.py        ResumableDistributedSampler (torch); shipped to nodes beside checkpoint.py
  fabric.py         `clusterctl.fabric.group`: a job's nodes as a Fabric group
templates/          job.yaml (shipped in the wheel as clusterctl.templates)
tests/              unit/<package>/ like the code (+ fixtures/ golden files), fakes/ (shared fakes), integration/
                    (testbed), testbed/ (the testbed), gpu/ (not in make test)
bench/              fanout, preflight, launch, recovery, checkpoint: side-by-side ratios -> docs/benchmarks.md
tools/              relayout.py (issue 25: the move into these packages, re-runnable)
"""


class Run:
    def __init__(self, root: Path, dry: bool):
        self.root, self.dry = root, dry
        self.log: list[str] = []
        self.warnings: list[str] = []
        self.long_lines: list[tuple[str, str]] = []      # (file, line) made longer than 120 by a rewrite

    # ------------------------------------------------------------------ helpers
    def note(self, msg: str) -> None:
        self.log.append(msg)

    def write(self, rel: str, text: str) -> None:
        p = self.root / rel
        if p.exists() and p.read_text() == text:
            return
        self.note(f"write {rel}")
        if not self.dry:
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text(text)

    def git_mv(self, old: str, new: str) -> None:
        src, dst = self.root / old, self.root / new
        if not src.exists():
            if not dst.exists():
                self.warnings.append(f"neither {old} nor {new} exists")
            return
        if dst.exists():
            self.warnings.append(f"both {old} and {new} exist: not moved")
            return
        self.note(f"git mv {old} {new}")
        if self.dry:
            return
        dst.parent.mkdir(parents=True, exist_ok=True)
        tracked = subprocess.run(["git", "ls-files", "--error-unmatch", old], cwd=self.root,
                                 capture_output=True).returncode == 0
        if tracked:
            subprocess.run(["git", "mv", old, new], cwd=self.root, check=True)
        else:
            src.rename(dst)
        deeper = len(Path(new).parts) - len(Path(old).parts)
        if deeper and dst.suffix == ".py" and old.startswith("tests/"):
            self.fix_file_relative_paths(dst, deeper)

    def fix_file_relative_paths(self, path: Path, deeper: int) -> None:
        """A test moved ``deeper`` folders down finds its fixtures from ``__file__``: one more step up each time
        (done once, right after its move, so that a second run leaves it alone)."""
        text = self.drop_path_hack(path.read_text())     # before: the hack names Path(__file__).parent too
        new = re.sub(r"(Path\(__file__\)(?:\.resolve\(\))?\.parents\[)(\d+)\]",
                     lambda m: f"{m.group(1)}{int(m.group(2)) + deeper}]", text)
        new = re.sub(r"(Path\(__file__\)(?:\.resolve\(\))?(?:\.parent)+)(?![\w\[])",
                     lambda m: m.group(1) + ".parent" * deeper, new)
        new = new.replace("os.path.dirname(__file__), ", "os.path.dirname(__file__), " + '"..", ' * deeper)
        if new != text:
            self.note(f"paths from __file__ one level further up in {path.relative_to(self.root)}")
            path.write_text(new)

    # ------------------------------------------------------------------ 1. relative -> absolute
    def absolute_imports(self) -> None:
        rel_re = re.compile(r"^(\s*from\s+)(\.+)([\w.]*)(\s+import\b)", re.M)
        for path in sorted((self.root / "clusterctl").rglob("*.py")):
            parts = path.relative_to(self.root).with_suffix("").parts
            package = list(parts[:-1])          # the package the module is in (for __init__: itself)

            def repl(m: re.Match) -> str:
                up = len(m.group(2)) - 1
                base = package[:len(package) - up] if up else package
                target = ".".join(base + ([m.group(3)] if m.group(3) else []))
                return f"{m.group(1)}{target}{m.group(4)}"

            text = path.read_text()
            new = rel_re.sub(repl, text)
            if new != text:
                self.note(f"absolute imports in {path.relative_to(self.root)}")
                if not self.dry:
                    path.write_text(new)

    # ------------------------------------------------------------------ 2. moves
    @staticmethod
    def mod_path(mod: str, root: Path) -> str:
        rel = mod.replace(".", "/")
        return rel if (root / rel).is_dir() else rel + ".py"

    def move_modules(self) -> None:
        for old, new in MODULES.items():
            old_rel = old.replace(".", "/")
            new_rel = new.replace(".", "/")
            if (self.root / old_rel).is_dir():
                self.git_mv(old_rel, new_rel)
            elif (self.root / new_rel).is_dir():
                pass
            else:
                self.git_mv(old_rel + ".py", new_rel + ".py")
        for old, new in FILE_MOVES.items():
            self.git_mv(old, new)
        for pkg, doc in PACKAGE_DOCS.items():
            init = self.root / "clusterctl" / pkg / "__init__.py"
            if not init.exists():
                self.write(f"clusterctl/{pkg}/__init__.py", f'"""{doc}"""\n')
        if not (self.root / "clusterctl/supervise/__main__.py").exists():
            self.write("clusterctl/supervise/__main__.py", SUPERVISE_MAIN)
        if not (self.root / "clusterctl/cli/__main__.py").exists():
            self.write("clusterctl/cli/__main__.py", CLI_MAIN)

    def move_tests(self) -> None:
        unit = self.root / "tests/unit"
        for old, new in TESTS.items():
            self.git_mv(f"tests/unit/{old}", f"tests/{new}")
        dirs = {str(Path("tests") / new).rsplit("/", 1)[0] for new in TESTS.values()} | {"tests/unit"}
        for d in sorted(dirs):
            if not (self.root / d / "__init__.py").exists():
                self.write(f"{d}/__init__.py", "")
        for p in sorted(unit.glob("*.py")):
            if p.name not in TESTS_KEEP and p.name not in TESTS:
                self.warnings.append(f"unit test not in the table, left in tests/unit: {p.name}")
        files = HERE / "relayout_files"
        self.write("tests/unit/test_import_graph.py", (files / "test_import_graph.py").read_text())
        if not (self.root / "tests/unit/supervise/test_supervise_entry.py").exists():
            self.write("tests/unit/supervise/test_supervise_entry.py", (files / "test_supervise_entry.py").read_text())

    # ------------------------------------------------------------------ 3. references
    def tables(self):
        dotted = dict(MODULES)
        paths: dict[str, str] = {}
        for old, new in MODULES.items():
            o, n = old.replace(".", "/"), new.replace(".", "/")
            if (self.root / n).is_dir() or (self.root / o).is_dir():
                paths[o] = n                      # a package: clusterctl/runtimes/bare.py, clusterctl/runtimes/
            else:
                paths[o + ".py"] = n + ".py"
        bare: dict[str, str] = {}
        integration = {p.name for p in (self.root / "tests/integration").glob("*.py")}
        for old, new in TESTS.items():
            paths[f"tests/unit/{old}"] = f"tests/{new}"
            o = f"tests.unit.{old[:-3]}"
            dotted[o] = "tests." + new[:-3].replace("/", ".")
            if old not in integration and old != "sshserver.py":
                bare[old] = f"tests/{new}"
        return dotted, paths, bare

    def rewrite_references(self) -> None:
        dotted, paths, bare = self.tables()
        dotted_re = re.compile(r"(?<![\w.])(" + "|".join(re.escape(k) for k in
                                                         sorted(dotted, key=len, reverse=True)) + r")(?!\w)")
        paths_re = re.compile(r"(?<![\w/.])(" + "|".join(re.escape(k) for k in
                                                         sorted(paths, key=len, reverse=True)) + r")(?![\w])")
        bare_re = re.compile(r"(?<![\w/.])(" + "|".join(re.escape(k) for k in bare) + r")(?![\w])")
        from_re = re.compile(r"^([ \t]*)from clusterctl import ([\w ,]+?)([ \t]*(#.*)?)$", re.M)
        short = {old.split(".", 1)[1]: new for old, new in MODULES.items()}
        paren_re = re.compile(r"^([ \t]*from )([\w.]+)( import \()([^)]*\))", re.M)

        def realign(m: re.Match) -> str:
            """``from clusterctl.x import (a, b,`` + continuation lines aligned after the parenthesis: still
            aligned once the module's name is longer."""
            module = dotted_re.sub(lambda d: dotted[d.group(1)], m.group(2))
            old_col = len(m.group(1) + m.group(2) + m.group(3))
            new_col = len(m.group(1) + module + m.group(3))
            lines = m.group(4).split("\n")
            for i in range(1, len(lines)):
                if len(lines[i]) - len(lines[i].lstrip(" ")) == old_col:
                    lines[i] = " " * new_col + lines[i].lstrip(" ")
            return m.group(1) + m.group(2) + m.group(3) + "\n".join(lines)
        me = Path(__file__).resolve()

        def from_repl(m: re.Match) -> str:
            indent, names, tail = m.group(1), m.group(2), m.group(3)
            keep, moved = [], {}
            for item in (s.strip() for s in names.split(",")):
                if not item:
                    continue
                name, _, alias = item.partition(" as ")
                name, alias = name.strip(), alias.strip()
                if name in short:
                    pkg, _, mod = short[name].rpartition(".")
                    alias = alias or (name if mod != name else "")
                    moved.setdefault(pkg, []).append(mod + (f" as {alias}" if alias else ""))
                else:
                    keep.append(item)
            if not moved:
                return m.group(0)
            lines = ([f"from clusterctl import {', '.join(keep)}"] if keep else []) + \
                [f"from {pkg} import {', '.join(mods)}" for pkg, mods in moved.items()]
            lines[0] += tail
            return "\n".join(indent + line for line in lines)

        for path in self.files():
            if path.resolve() == me:
                continue
            rel = str(path.relative_to(self.root))
            try:
                text = path.read_text()
            except UnicodeDecodeError:
                continue
            new = from_re.sub(from_repl, text)
            if path.suffix == ".py":
                new = paren_re.sub(realign, new)
            new = dotted_re.sub(lambda m: dotted[m.group(1)], new)
            new = paths_re.sub(lambda m: paths[m.group(1)], new)
            if path.suffix == ".md":
                new = bare_re.sub(lambda m: bare[m.group(1)], new)
            if rel.startswith("tests/"):
                new = self.drop_path_hack(new)
            if path.suffix == ".py":
                before = {ln for ln in text.splitlines() if len(ln) > 120}
                for ln in new.splitlines():
                    if len(ln) > 120 and ln not in before:
                        self.long_lines.append((rel, ln))
            if new != text:
                self.note(f"rewrite {rel}")
                if not self.dry:
                    path.write_text(new)
            if path.suffix == ".py" and re.search(r"^\s*from clusterctl import \($", new, re.M):
                self.warnings.append(f"{rel}: a parenthesized `from clusterctl import (` is not rewritten")

    @staticmethod
    def drop_path_hack(text: str) -> str:
        """tests/unit files put their own folder on sys.path to import the shared fakes: now tests.fakes."""
        local = {old[:-3]: "tests." + new[:-3].replace("/", ".") for old, new in TESTS.items()}
        text = re.sub(r"^([ \t]*)from (test_\w+) import",
                      lambda m: f"{m.group(1)}from {local.get(m.group(2), m.group(2))} import", text, flags=re.M)
        hack = re.compile(r"^sys\.path\.insert\(0, str\(Path\(__file__\)\.parent\)\)\n", re.M)
        if not hack.search(text):
            return text
        text = hack.sub("", text)
        body = re.sub(r"^(import sys|from pathlib import Path)\n", "", text, flags=re.M)
        if not re.search(r"\bsys\.", body):
            text = re.sub(r"^import sys\n", "", text, count=1, flags=re.M)
        if not re.search(r"\bPath\b", body):
            text = re.sub(r"^from pathlib import Path\n", "", text, count=1, flags=re.M)
        return text

    def files(self):
        for r in REWRITE_ROOTS:
            p = self.root / r
            cands = [p] if p.is_file() else sorted(p.rglob("*")) if p.is_dir() else []
            for f in cands:
                rel = str(f.relative_to(self.root))
                if not f.is_file() or rel.startswith(SKIP) or "__pycache__" in rel or "/." in "/" + rel:
                    continue
                if f.suffix in TEXT_SUFFIXES or f.name == "Makefile":
                    yield f

    # ------------------------------------------------------------------ 4. patches, pyproject, README
    def patch(self) -> None:
        for rel, old, new in PATCHES:
            p = self.root / rel
            if not p.exists():
                self.warnings.append(f"patch: {rel} missing")
                continue
            text = p.read_text()
            if old in text:
                self.note(f"patch {rel}: {old.strip().splitlines()[0][:60]}")
                if not self.dry:
                    p.write_text(text.replace(old, new))
            elif new not in text:
                self.warnings.append(f"patch: anchor not found in {rel}: {old.strip().splitlines()[0][:70]}")

    def pyproject(self) -> None:
        p = self.root / "pyproject.toml"
        text = p.read_text()
        pkgs = sorted(".".join(i.parent.relative_to(self.root).parts)
                      for i in (self.root / "clusterctl").rglob("__init__.py") if "__pycache__" not in str(i))
        pkgs = sorted(pkgs, key=lambda s: (s != "clusterctl", s)) + ["clusterctl.templates"]
        line = "packages = [\n" + "".join(f'  "{x}",\n' for x in pkgs) + "]"
        new = re.sub(r"^packages = \[[^\]]*\]", lambda _: line, text, count=1, flags=re.M)
        if new != text:
            self.note("pyproject: packages")
            if not self.dry:
                p.write_text(new)

    def readme(self) -> None:
        p = self.root / "README.md"
        text = p.read_text()
        new = re.sub(r"(## Layout\n\n```\n).*?(```\n)", lambda m: m.group(1) + LAYOUT_README + m.group(2), text,
                     count=1, flags=re.S)
        if new != text:
            self.note("README: Layout")
            if not self.dry:
                p.write_text(new)

    # ------------------------------------------------------------------ 5. report
    def report_long_lines(self) -> None:
        for rel, ln in self.long_lines:
            p = self.root / rel
            if self.dry or ln in p.read_text().splitlines():       # not fixed by a patch since
                self.warnings.append(f"{rel}: a rewritten line is longer than 120: {ln.strip()[:60]}...")

    def report_unmapped(self) -> None:
        pkg = self.root / "clusterctl"
        for p in sorted(pkg.glob("*.py")):
            mod = f"clusterctl.{p.stem}" if p.stem != "__init__" else "clusterctl"
            if mod not in KEEP and mod not in MODULES:
                self.warnings.append(f"module not in the table, left in place: clusterctl/{p.name}")
        for d in sorted(x for x in pkg.iterdir() if x.is_dir() and x.name != "__pycache__"):
            if d.name not in KEEP_PACKAGES and d.name not in PACKAGE_DOCS and d.name != "cli":
                self.warnings.append(f"package not in the table, left in place: clusterctl/{d.name}/")

    def run(self) -> int:
        self.absolute_imports()
        self.move_modules()
        self.move_tests()
        self.rewrite_references()
        self.patch()
        self.pyproject()
        self.readme()
        self.report_long_lines()
        self.report_unmapped()
        for line in self.log:
            print(line)
        print(f"{len(self.log)} change(s){' (dry run)' if self.dry else ''}")
        for w in self.warnings:
            print(f"warning: {w}", file=sys.stderr)
        return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dry-run", action="store_true", help="print what would change; change nothing")
    args = ap.parse_args(argv)
    top = subprocess.run(["git", "rev-parse", "--show-toplevel"], capture_output=True, text=True, check=True,
                         cwd=HERE).stdout.strip()
    return Run(Path(top), args.dry_run).run()


if __name__ == "__main__":
    sys.exit(main())
