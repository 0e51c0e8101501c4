"""Documented examples in step with the CLI (issue 39 item 13): every `clusterctl ...` line in a code block of the
README and docs/ names a command that exists and only flags its --help lists; the 80-column examples of
docs/oncall.md show the header lines the CLI prints."""
from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest
from click.testing import CliRunner

from clusterctl.cli import app
from tests.unit.cli.test_first_hour import cli

REPO = Path(__file__).resolve().parents[3]
GLOBAL = ("--debug", "--version", "--accept-new-host-keys")


def documented_commands():
    for path in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        block = False
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if line.startswith("```"):
                block = not block
                continue
            m = re.match(r"^\s*(?:\$\s+)?clusterctl\s+(.*)$", line) if block else None
            if m:
                yield f"{path.name}:{number}", re.split(r" #|\||&&|;", m.group(1))[0]


def test_every_documented_command_line_is_one_the_cli_takes():
    helps: dict = {}
    checked = 0
    for where, text in documented_commands():
        try:
            words = shlex.split(text)
        except ValueError:
            words = text.split()
        words = words[: words.index("--")] if "--" in words else words
        while "--state-dir" in words:
            i = words.index("--state-dir")
            del words[i: i + 2]
        cmd = next((w for w in words if not w.startswith("-")), None)
        if cmd not in helps:
            got = CliRunner().invoke(app, [cmd, "--help"] if cmd else ["--help"])
            helps[cmd] = got.output if got.exit_code == 0 else ""     # an unknown command's usage error: exit 2
        assert helps[cmd].startswith("Usage:"), f"{where}: `clusterctl {text}`: no command {cmd!r}"
        for w in words:
            flag = w.split("=", 1)[0]
            if re.fullmatch(r"--?[A-Za-z][\w-]*", flag) and flag not in GLOBAL:
                assert flag in helps[cmd], f"{where}: `clusterctl {text}`: {cmd} has no {flag}"
        checked += 1
    assert checked > 30


def _example(doc: str, prompt: str) -> list[str]:
    lines = (REPO / "docs" / doc).read_text().splitlines()
    i = next(i for i, ln in enumerate(lines) if ln.startswith(prompt))
    return lines[i + 1:]


def test_the_80_column_examples_of_oncall_md_have_the_clis_headers(tmp_path):
    from clusterctl.store import paths
    from clusterctl.store.state import JobState, Store

    with Store(paths.db_path(paths.ensure_state_dir(tmp_path / "state"))) as s:
        j = s.create_job("quickstart", json.dumps({"spec": {"name": "quickstart", "script": "t.py"}, "hosts": []}),
                         None, None)
        s.start_attempt(j, 1, "localhost", "r", ["localhost"])
        s.set_state(j, JobState.STARTING)
        s.set_state(j, JobState.SUCCEEDED, "every node finished with exit code 0")
        s.cordon("localhost", "ECC errors on GPU 3")
    shown = _example("oncall.md", "$ clusterctl status                  # COLUMNS=80")
    got = cli(tmp_path, "status", columns=80).stdout.splitlines()
    assert shown[0] == got[0] and len(shown[1]) == len(got[1]) and shown[2] == got[2], (shown[:3], got)
    shown = _example("oncall.md", "$ clusterctl nodes                   # COLUMNS=80")
    got = cli(tmp_path, "nodes", columns=80).stdout.splitlines()
    assert shown[0] == got[0], (shown[0], got[0])

    def hhmm(lines):
        return [re.sub(r"(cordoned +)\d+", r"\g<1>N", re.sub(r"since \d\d:\d\d", "since HH:MM", ln)) for ln in lines]

    assert hhmm(shown[:3]) == hhmm(got), (shown[:3], got)      # the row, and the cordon's reason under it


@pytest.mark.parametrize("doc", ["README.md", *(f"docs/{p.name}" for p in sorted((REPO / "docs").glob("*.md")))])
def test_documented_job_ids_have_the_clis_shape(doc):
    """Job ids in examples are `<name>-<YYYYMMDD-HHMMSS>-<12 hex>` as the CLI makes them (not 4 hex digits)."""
    text = (REPO / doc).read_text()
    ids = re.findall(r"\b[a-z0-9-]+-20\d{6}-\d{6}-[0-9a-f]+\b", text)
    short = sorted({i for i in ids if len(i.rsplit("-", 1)[1]) != 12})
    assert not short, f"{doc}: job ids with a suffix other than 12 hex digits: {short[:5]}"


# ---------------------------------------------------------------------------------------- job keys and the template
def _table(doc: str, first_column: str) -> dict[str, str]:
    """`| `key` | default | ... |` rows of a docs table whose first column is a backticked name."""
    rows = re.findall(rf"^\| `({first_column})` \| (.*?) \|", (REPO / "docs" / doc).read_text(), re.M)
    return dict(rows)


def _spec_fields(model=None, prefix=""):
    """Every key of the job spec, dotted, with its default (``...`` for a required one)."""
    import typing

    from pydantic import BaseModel

    from clusterctl.config.spec import JobSpec, NotifyTarget

    model = model or JobSpec
    for name, f in model.model_fields.items():
        key = prefix + name
        sub = [a for a in (f.annotation, *typing.get_args(f.annotation))
               if isinstance(a, type) and issubclass(a, BaseModel)]
        if key == "notify":
            sub = [NotifyTarget]
        yield key, (... if f.is_required() else f.get_default(call_default_factory=True))
        if sub:
            yield from _spec_fields(sub[0], key + ".")


def _doc_default(text: str):
    import yaml

    text = text.strip()
    if text in ("required",):
        return ...
    if text in ("—", ""):
        return None
    return yaml.safe_load(text.strip("`"))


def test_job_md_lists_every_key_of_the_spec_with_its_default():
    """docs/job.md's key table: exactly the spec's keys, each with the spec's default."""
    text = (REPO / "docs" / "job.md").read_text()
    table = text.split("| key | default | meaning |", 1)[1].split("\n\n", 1)[0]
    documented = dict(re.findall(r"^\| `([a-z_.]+)` \| (.*?) \|", table, re.M))
    fields = dict(_spec_fields())
    assert sorted(documented) == sorted(fields), sorted(set(documented) ^ set(fields))
    for key, default in fields.items():
        if hasattr(default, "model_dump"):         # a section: its keys have their own rows
            continue
        doc = _doc_default(documented[key])
        if key == "torchrun":                      # a string is split as a shell would
            doc = [doc]
        if key == "container.ulimits":             # integers in the file, kept as text
            doc = {k: str(v) for k, v in doc.items()}
        assert doc == default, f"docs/job.md: {key} defaults to {documented[key]}, the spec to {default!r}"


def test_the_template_shows_every_key_at_its_default():
    """templates/job.yaml says 'Every key is shown with its default': it was missing `recovery`."""
    import yaml

    from clusterctl.config.spec import JobSpec, load_job

    path = REPO / "templates" / "job.yaml"
    shown = yaml.safe_load(path.read_text())
    spec = JobSpec(name=shown["name"], script=shown["script"]).model_dump(mode="json")
    spec.pop("module")                          # the template names it in script's comment: one of the two

    def keys(d, where=""):
        for k, v in d.items():
            yield f"{where}{k}"
            if isinstance(v, dict) and k not in ("env", "ulimits"):
                yield from keys(v, f"{where}{k}.")

    assert sorted(set(keys(spec)) ^ set(keys(shown))) == [], "template keys differ from the spec's"
    assert load_job(str(path)).model_dump(mode="json") == {**spec, "module": None}


def test_hosts_null_is_described_as_the_launch_plans_it(tmp_path):
    """`hosts: null` takes the inventory's first MAX hosts and no spares (a Slurm allocation: every node); the
    template, docs/job.md and the schema's description said 'all hosts ... beyond MAX are spares'."""
    from clusterctl.config.schema import DESCRIPTIONS
    from clusterctl.usecases.context import load_context

    (tmp_path / "inv.yaml").write_text("all:\n  vars: {clusterctl_runtime: bare}\n  hosts: {n1: {}, n2: {}, n3: {}}\n")
    (tmp_path / "job.yaml").write_text("name: j\nnodes: 2\nscript: t.py\n")
    ctx = load_context(str(tmp_path / "job.yaml"), str(tmp_path / "inv.yaml"))
    assert [h.name for h in ctx.hosts] == ["n1", "n2"]       # no spare: n3 is not the job's
    template = (REPO / "templates" / "job.yaml").read_text().split("\nhosts:", 1)[1].split("\nnotify:", 1)[0]
    row = re.search(r"^\| `hosts` \|.*$", (REPO / "docs" / "job.md").read_text(), re.M).group(0)
    for where, text in [("templates/job.yaml", template), ("docs/job.md", row),
                        ("schema description", DESCRIPTIONS["hosts"])]:
        flat = " ".join(text.replace("`", "").split())
        assert re.search(r"null: the inventory's first MAX hosts,? (and )?no spares", flat), (where, flat)
        assert "slurm" in flat, (where, flat)


# ---------------------------------------------------------------------------------------- status, budgets, classes
def _block_after(doc: str, marker: str) -> list[str]:
    lines = (REPO / "docs" / doc).read_text().splitlines()
    i = next(i for i, ln in enumerate(lines) if marker in ln)
    j = next(j for j in range(i + 1, len(lines)) if lines[j].strip() == "```")
    return [ln.strip() for ln in lines[i:j]]


def test_the_unsupervised_status_example_of_oncall_md_is_what_status_prints():
    """oncall.md's first-five-minutes example, rendered from the same values by `status`'s own view: every line
    (its `restarts` line lacked the window status prints)."""
    from clusterctl.views import status

    now = 1_000_000.0
    job_id = "killtest-20261201-062958-d398a1c07e5f"
    why = "node localhost rank 1 was killed by SIGKILL"
    v = {"job_id": job_id, "name": "killtest", "state": "FAILED", "attempt": 1, "started_at": now - 23,
         "reason": f"{why} (while unsupervised); `clusterctl resume killtest` relaunches from the start (no "
                   "checkpoint yet)",
         "reconciled": {"attempt": 1, "verdict": "killed", "message": why, "state": "FAILED"},
         "rendezvous_host": "localhost", "warnings": [], "startup": None, "checkpoint": None, "stuck": [],
         "stragglers": [], "relaunches": [], "supervised": False,
         "supervisor": {"pid": 6275, "alive": False, "last_seen": now - 6, "host": "vm", "elsewhere": False},
         "nodes": [{"node": "localhost", "state": "killed", "exit_code": 1, "signal": "SIGKILL"}],
         "restarts": {"failures_used": 0, "max_failures": 7, "node_failures_used": 0, "max_node_failures": 10,
                      "window": "24h", "window_s": 86400.0},
         "failures": [{"attempt": 1, "class": "killed", "node": "localhost", "rank": 1, "exit_code": 1,
                       "signal": "SIGKILL", "oom": False, "message": f"while unsupervised: {why}",
                       "error_tail": "", "stacks": None}]}
    shown = _block_after("oncall.md", f"UNSUPERVISED: clusterctl's supervisor of job {job_id}")
    assert shown == status.text(v, now)


def test_documented_budget_exhaustion_says_the_window_as_the_supervisor_does():
    """'restart budget exhausted (N restarts.max_failures within 24h)' (oncall.md's --watch and webhook examples
    lacked the window)."""
    from clusterctl.model import budget

    said = 0
    for path in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        text = " ".join(path.read_text().split())
        for m in re.finditer(r"restart budget exhausted \((\d+) (restarts\.max_(?:node_)?failures)([^)]*)\)", text):
            window = m.group(3).strip()
            allowed = {budget.describe(None), *(budget.describe(s) for s in (30, 5400, 86400, 7 * 86400))}
            assert window in allowed, f"{path.name}: {m.group(0)!r}: the supervisor says one of {sorted(allowed)}"
            said += 1
    assert said >= 2


def _classes(text: str) -> list[str]:
    return re.findall(r"`([a-z_]+)`", text)


def test_documented_failure_classes_of_cordons_and_nodes_are_the_codes():
    """The automatic cordon counts INFRA (node_lost, rendezvous_lost, hang, gpu_error, straggler); `nodes` counts
    every failure class. oncall.md and job.md named only some."""
    from clusterctl.model.verdicts import INFRA
    from clusterctl.views.status import FAILURE_KLASSES

    infra = [v.value for v in INFRA]
    oncall = " ".join((REPO / "docs" / "oncall.md").read_text().split())
    auto = re.search(r"\*\*Automatic cordon\.\*\* After `supervisor\.cordon_after` \([^)]*\) (.*?) failures of one "
                     r"host", oncall).group(1)
    assert _classes(auto) == infra, auto
    row = " ".join(_table("job.md", r"supervisor\.cordon_after")["supervisor.cordon_after"].split())
    job_md = re.search(r"`supervisor\.cordon_after` \| `3` \| The supervisor cordons a host after this many (\S+) "
                       r"failures", " ".join((REPO / "docs" / "job.md").read_text().split())).group(1)
    assert row and _classes(job_md) == infra, job_md
    nodes = re.search(r"its failures by class \(([^)]*)\) in the last 7 days", oncall).group(1)
    assert sorted(_classes(nodes)) == sorted(FAILURE_KLASSES), nodes


# ---------------------------------------------------------------------------------------- inventory, doctor, globals
def test_job_md_lists_every_inventory_var():
    from clusterctl.config.inventory import KNOWN_VARS

    documented = _table("job.md", r"(?:ansible|clusterctl)_[a-z_]+")
    assert set(documented) == set(KNOWN_VARS), sorted(set(documented) ^ set(KNOWN_VARS))


def test_oncall_md_doctor_row_names_every_check_doctor_runs(tmp_path):
    r = cli(tmp_path, "doctor", "-o", "json")
    ids = [c["check"] for c in json.loads(r.stdout)]
    said = {"ssh_agent": "ssh-agent", "ssh_config": "`~/.ssh/config`", "key_permissions": "0600",
            "state_dir": "state dir", "torchrun": "`torchrun`"}
    assert sorted(ids) == sorted(said), ids
    row = re.search(r"^\| `clusterctl doctor .*$", (REPO / "docs" / "oncall.md").read_text(), re.M).group(0)
    assert [c for c in ids if said[c] not in row] == [], row
    helped = " ".join(CliRunner().invoke(app, ["doctor", "--help"]).output.split())    # its own --help too
    said = {**said, "key_permissions": "key permissions"}
    assert [c for c in ids if said[c].strip("`") not in helped] == [], helped


@pytest.mark.parametrize("cmd", ["exec", "preflight"])
def test_limit_help_names_the_ansible_patterns_limit_takes(cmd):
    """oncall.md: `--limit 'train:&rack_b:!gpu03'` (exec and preflight, the same syntax); their --help said
    neither `&` nor `!`."""
    assert "--limit 'train:&rack_b:!gpu03'" in (REPO / "docs" / "oncall.md").read_text()
    helped = " ".join(CliRunner().invoke(app, [cmd, "--help"]).output.split())
    assert "':&part'" in helped and "':!part'" in helped and "gpu[01:04]" in helped, helped


def test_the_documented_state_dir_rules_are_the_clis():
    """Which commands start a missing --state-dir, and which read no job state (oncall.md's global flags)."""
    from clusterctl.cli.base import CREATES_STATE_DIR, NO_STATE_READ

    text = " ".join((REPO / "docs" / "oncall.md").read_text().split())
    rule = re.search(r"a `--state-dir` that does not exist is a usage error, exit 2, except for (.*?), which start "
                     r"one, and (.*?), which read no job state", text)
    assert rule, "oncall.md: the missing --state-dir rule"
    assert sorted(_classes(rule.group(1))) == sorted(CREATES_STATE_DIR)
    assert sorted(_classes(rule.group(2))) == sorted(NO_STATE_READ)
    helped = CliRunner().invoke(app, ["--help"]).output
    assert "$CLUSTERCTL_STATE_DIR, else platformdirs" in " ".join(helped.split())
    for doc in (REPO / "README.md", REPO / "docs" / "oncall.md"):
        assert "`$CLUSTERCTL_STATE_DIR`, else platformdirs' user state dir" in " ".join(doc.read_text().split()), doc


# ---------------------------------------------------------------------------------------- resume
def test_the_documented_resume_lines_have_the_shape_resume_prints(tmp_path):
    """oncall.md's resume example is the summary line, the attempt's header and its start event as `resume`
    prints them; the README's re-attach line has the use case's shape."""
    from clusterctl.store.state import JobState
    from clusterctl.usecases import lifecycle
    from tests.unit.test_jobs import INVENTORY, JOB, Spawn, World
    from clusterctl.store.state import Store
    from clusterctl.usecases import base

    (tmp_path / "inventory.yaml").write_text(INVENTORY)
    (tmp_path / "job.yaml").write_text(JOB)
    (tmp_path / "train.py").write_text("print('hi')\n")
    ws, world, spawn = base.Workspace(tmp_path, Store(tmp_path / "state.db")), World(), Spawn()
    out = lifecycle.launch(ws, lifecycle.LaunchRequest(str(tmp_path / "job.yaml"), str(tmp_path / "inventory.yaml")),
                           connect=world.connect, spawn=spawn)
    ws.store.start_attempt(out.job_id, 1, "n1", "r", ["n1", "n2"])
    ws.store.set_state(out.job_id, JobState.STOPPED, "stopped by user")
    r = lifecycle.resume(ws, lifecycle.ResumeRequest("j"), connect=world.connect, spawn=spawn, wait=lambda s: None)
    printed = f"job {r.job_id}: {r.message}"

    def shape(line: str) -> str:
        return re.sub(r"\b[a-z]+-20\d{6}-\d{6}-[0-9a-f]{12}\b", "ID", re.sub(r"pid \d+", "pid P", line))

    shown = _block_after("oncall.md", "relaunching attempt 2 from the start")
    assert shape(shown[0]) == shape(printed), (shown[0], printed)
    assert shown[1] == "[localhost/-] === attempt 2 ==="       # the attempt's header, as `logs` shows it
    assert re.fullmatch(r"clusterctl: attempt 2: starting on localhost \(rendezvous localhost\); no checkpoint yet",
                        shown[2]), shown[2]
    readme = (REPO / "README.md").read_text()
    comment = re.search(r"^clusterctl resume vit-pretrain +# (.*)$", readme, re.M).group(1)
    assert re.fullmatch(r"job vit-pretrain-\.\.\.: attempt \d+ still runs on [\w, .]+: re-attached", comment), comment


# ---------------------------------------------------------------------------------------- the quickstart
def test_the_quickstart_readme_lists_every_flag_of_train_py_with_its_default():
    """examples/quickstart/README.md's flag table is train.py's argparse (it lacked --lr, which docs/job.md's
    `launch job.yaml -- --lr 0.1` uses)."""
    import ast

    readme = (REPO / "examples" / "quickstart" / "README.md").read_text()
    rows = dict(re.findall(r"^\| `(--[a-z-]+)(?: [A-Z_]+)?` \|([^|]*)\|", readme, re.M))
    flags = {}          # train.py's add_argument calls, read without importing torch
    for node in ast.walk(ast.parse((REPO / "examples" / "quickstart" / "train.py").read_text())):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "add_argument":
            kw = {k.arg: k.value for k in node.keywords}
            flags[node.args[0].value] = ast.literal_eval(kw["default"]) if "default" in kw else None
    assert sorted(rows) == sorted(flags)
    for flag, default in flags.items():
        shown = rows[flag].strip()
        if default not in (None, False, 0) or shown:
            assert float(shown) == float(default), (flag, shown, default)
    block = re.search(r"```sh\n(clusterctl launch examples/quickstart/job.yaml --dry-run.*?)```", readme, re.S).group(1)
    status = re.search(r"^clusterctl status\b(.*?)#", block, re.M).group(1).strip()
    assert status == "quickstart", "`clusterctl status` alone lists jobs (no checkpoint); `status quickstart` has it"


# ---------------------------------------------------------------------------------------- the commands tables
def _command_rows(doc: Path) -> dict[str, str]:
    """Each command's text in a `| `clusterctl CMD ...` | ... |` row (uncordon: after the `/` in cordon's)."""
    text = doc.read_text()
    rows: dict[str, str] = {}
    for cmd, rest in re.findall(r"^\| `clusterctl ([a-z-]+)((?:\\\||[^|])*)\|", text, re.M):
        rows[cmd] = rows.get(cmd, "") + rest
    for cmd, rest in re.findall(r" / `(uncordon)((?:\\\||[^|])*)\|", text):
        rows[cmd] = rows.get(cmd, "") + rest
    return rows


@pytest.mark.parametrize("doc", ["README.md", "docs/oncall.md"])
def test_the_commands_tables_name_every_command_and_every_flag(doc):
    """The README's commands table and oncall.md's 'Every command' name each visible command and each of its
    options (`cordon --slurm-drain`, `sbatch --signal-s/--script/--output` and oncall.md's sbatch row were missing)."""
    import click

    rows = _command_rows(REPO / doc)
    for name, cmd in app.commands.items():
        if cmd.hidden:
            continue
        assert name in rows, f"{doc}: no row for `clusterctl {name}`"
        for p in cmd.params:
            opts = getattr(p, "opts", []) + getattr(p, "secondary_opts", [])
            if not isinstance(p, click.Option) or p.hidden or {"--help", *GLOBAL} & set(opts):
                continue
            assert any(re.search(re.escape(o) + r"(?![\w-])", rows[name]) for o in opts), \
                f"{doc}: the `clusterctl {name}` row does not name {'/'.join(opts)}"


def test_the_sbatch_directives_slurm_md_lists_are_the_scripts(tmp_path):
    r = cli(tmp_path, "--state-dir", str(tmp_path), "sbatch", str(REPO / "examples" / "quickstart" / "job.yaml"),
            "--dry-run")
    assert r.returncode == 0, r.stderr
    written = [re.match(r"#SBATCH (--[a-z-]+)", ln).group(1) for ln in r.stdout.splitlines()
               if ln.startswith("#SBATCH")]
    text = " ".join((REPO / "docs" / "slurm.md").read_text().split())
    said = re.search(r"- `#SBATCH (.*?)\. - \*\*GPUs", text).group(1)
    listed = re.findall(r"(--[a-z-]+)=?", "--" + said if not said.startswith("--") else said)
    assert sorted(set(listed)) == sorted(written), (listed, written)


# ---------------------------------------------------------------------------------------- JSON fields, event kinds
def _row(cmd: str) -> str:
    return re.search(rf"^\| `clusterctl {cmd} .*$", (REPO / "docs" / "oncall.md").read_text(), re.M).group(0)


def _json_fields(cmd: str) -> list[str]:
    """The fields oncall.md's 'Every command' row of `clusterctl CMD` gives its JSON (the first `{...}`)."""
    row = _row(cmd)
    return re.findall(r"\w+", re.search(r"JSON `\[?\{([^}]*)\}", row).group(1))


def test_the_documented_json_fields_are_what_the_commands_print(tmp_path):
    from clusterctl.store import paths
    from clusterctl.store.state import Store
    from clusterctl.views import status, top

    job = str(REPO / "examples" / "quickstart" / "job.yaml")
    got = {"doctor": json.loads(cli(tmp_path, "doctor", "-o", "json").stdout)[0],
           "validate": json.loads(cli(tmp_path, "validate", job, "-o", "json").stdout),
           "inventory": json.loads(cli(tmp_path, "inventory", "-o", "json").stdout)}
    with Store(paths.db_path(paths.ensure_state_dir(tmp_path / "st"))) as s:
        j = s.create_job("q", json.dumps({"spec": {"name": "q", "script": "t.py"}, "hosts": []}), None, None)
        s.add_event(j, "start", "attempt 1: starting on localhost", attempt=1)
        got["events"] = status.events_view(s, s.get_job(j))[0]
    for cmd, shown in got.items():
        assert _json_fields(cmd) == list(shown), (cmd, _json_fields(cmd), list(shown))
    host = re.search(r"each host `\{([^}]*)\}", _row("inventory")).group(1)
    assert re.findall(r"\w+", host) == list(got["inventory"]["hosts"][0])
    assert _json_fields("top") == ["ranks"]
    oncall = (REPO / "docs" / "oncall.md").read_text()
    rank = re.search(r'`\{"ranks": \[\{(.*?), \.\.\.\}\]\}`', " ".join(oncall.split())).group(1)
    assert set(re.findall(r'"(\w+)"', rank)) == set(top.KEYS)


def test_documented_event_kinds_are_event_kinds():
    from clusterctl.model.events import EventKind

    kinds = {k.value for k in EventKind}
    for path in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        text = " ".join(path.read_text().split())
        for kind in re.findall(r"`([a-z_]+)` events?\b", text):
            assert kind in kinds, f"{path.name}: `{kind}` event is no EventKind"
        for kind in re.findall(r"^\d\d:\d\d:\d\d\s+attempt [\d-]+\s+([a-z_]+)\s", path.read_text(), re.M):
            assert kind in kinds, f"{path.name}: an events line of kind {kind!r}"


def test_the_80_column_top_example_of_oncall_md_is_what_top_prints():
    """oncall.md's `top --once` example, rendered by `top`'s own view from the values it shows: every line."""
    from clusterctl.views import top

    shown = _example("oncall.md", "$ clusterctl top bhangsleep1 --once")
    shown = shown[: shown.index("```")]
    ranks = []
    for line in shown[2:]:
        m = re.fullmatch(r"(\S+) +(\d+) +(\d+) +([\d.]+)s (\w+) +(\d+) +([\d.]+)M +- +- +(?:([\d.]+)s (.*)|-)", line)
        if not m:
            break
        ranks.append({"node": m[1], "rank": int(m[2]), "step": int(m[3]), "step_time_s": float(m[4]),
                      "state": m[5], "cpu_pct": float(m[6]), "rss_bytes": float(m[7]) * 2 ** 20,
                      "gpu_util_pct": None, "gpu_mem_bytes": None, "waiting_s": m[8] and float(m[8]),
                      "collective": m[9], "where": "sick.py:66 main"})
    stuck = next(ln for ln in shown if ln.startswith("STUCK: "))
    for r in ranks:
        r["stuck"] = stuck.removeprefix("STUCK: ") if r["state"] == "stuck" else None
    job_id = re.match(r"job (\S+)", shown[0]).group(1)
    assert len(ranks) == 6
    assert shown == top.text({"attempt": 1, "time": 99.0, "ranks": ranks}, job_id, now=100.0, width=80)


def test_preflight_md_tables_list_the_checks_in_the_order_preflight_runs_them(tmp_path):
    """preflight.md: 'Check ids appear in the order of the tables above' (host checks, then cluster checks)."""
    r = cli(tmp_path, "preflight", str(REPO / "examples" / "quickstart" / "job.yaml"), "-o", "json")
    got = json.loads(r.stdout)
    text = (REPO / "docs" / "preflight.md").read_text()
    host_table = text.split("## Per-host checks", 1)[1].split("\n## ", 1)[0]
    cluster_table = text.split("## Cluster checks", 1)[1].split("\n## ", 1)[0]
    ids = lambda table: re.findall(r"^\| `([a-z_]+)` \|", table, re.M)     # noqa: E731
    assert ids(host_table) == [c["id"] for c in got["hosts"][0]["checks"]]
    assert ids(cluster_table) == [c["id"] for c in got["cluster"]]


def test_the_documented_notification_payload_and_command_environment_are_the_codes():
    from clusterctl.supervise.notify import COMMAND_ENV_KEEP, PAYLOAD_KEYS

    text = " ".join((REPO / "docs" / "oncall.md").read_text().split())
    example = json.loads(re.search(r'```json (\{"job": .*?\}) ```', text).group(1))
    assert tuple(example) == PAYLOAD_KEYS
    env = re.search(r"A \*\*command\*\* gets the same fields in its environment: (.*?) \(empty when null\), and of "
                    r"the supervisor's own environment only (.*?) \(never", text)
    assert re.findall(r"`(\w+)`", env.group(1)) == [f"CLUSTERCTL_{k.upper()}" for k in PAYLOAD_KEYS]
    assert sorted(re.findall(r"`(\w+)`", env.group(2))) == sorted(COMMAND_ENV_KEEP)
    for doc in ("job.md",):     # the notify.command row names the same kept variables
        row = re.search(r"^\| `notify\.command` \|.*$", (REPO / "docs" / doc).read_text(), re.M).group(0)
        kept = re.search(r"Nothing else of the supervisor's environment reaches it but (.*?) \(", row).group(1)
        assert sorted(re.findall(r"`(\w+)`", kept)) == sorted(COMMAND_ENV_KEEP)


def test_launch_detach_json_has_the_documented_fields(tmp_path, monkeypatch):
    """oncall.md: `launch --detach --output json` prints `{job_id, name, supervisor_pid}` (it was undocumented)."""
    from types import SimpleNamespace

    from clusterctl.usecases import lifecycle

    monkeypatch.setattr(lifecycle, "launch", lambda ws, request, on_progress=None: SimpleNamespace(
        job_id="q-20261204-120000-0123456789ab", name="q", supervisor_pid=4242, warnings=[], nodes=["localhost"],
        spares=[], excluded=[]))
    r = CliRunner().invoke(app, ["--state-dir", str(tmp_path), "launch", str(REPO / "examples" / "quickstart" /
                                                                           "job.yaml"), "--detach", "-o", "json"])
    assert r.exit_code == 0, r.output
    shown = re.search(r"with `--detach`, `\{([^}]*)\}`", _row("launch")).group(1)
    assert re.findall(r"\w+", shown) == list(json.loads(r.stdout))


def test_slurm_md_shows_the_srun_command_line_a_node_command_gets():
    from clusterctl.transport.srun import srun_argv

    text = (REPO / "docs" / "slurm.md").read_text()
    shown = re.search(r"```\n(srun --overlap .*?)\n```", text, re.S).group(1).replace("\\\n", " ").split()
    got = srun_argv("HOST", ["ARGV"], jobid="$SLURM_JOB_ID")
    assert shown == ["srun", *got[1:]], (shown, got)


def test_the_documented_hang_failures_say_what_the_supervisor_says():
    """oncall.md's `status demo-hang` failure line is the hang verdict's message as `status` shows it (it lacked the
    key named, `(supervisor.hang_timeout_s)`); the README's stuck-rank hang names `supervisor.stuck_timeout_s`."""
    from clusterctl.model.verdicts import Observation
    from clusterctl.supervise.supervisor import Health, classify
    from clusterctl.views import status

    health = Health(started=0.0, last_progress=60.0, first_progress=True)
    d = classify([Observation("localhost", "running")], health, rdzv_host="localhost", probe_failures=2,
                 hang_timeout_s=40, now=101.0)
    assert d.verdict.value == "hang"
    shown = _block_after("oncall.md", "$ clusterctl status demo-hang")[2:]
    stacks = [ln.removeprefix("waiting: ") for ln in shown[1:]]
    v = {"job_id": "demo-hang-20261201-070000-0123456789ab", "name": "demo-hang", "state": "FAILED", "reason": "",
         "attempt": 1, "started_at": None, "rendezvous_host": "localhost", "nodes": [], "checkpoint": None,
         "supervised": True, "supervisor": {"pid": 1, "alive": True, "last_seen": None},
         "restarts": {"failures_used": 0, "max_failures": 3, "node_failures_used": 1, "max_node_failures": 10},
         "failures": [{"attempt": 1, "class": "hang", "node": None, "rank": None, "exit_code": None, "signal": None,
                       "message": d.message, "error_tail": "", "stacks": stacks}]}
    got = status.text(v)
    assert [ln.strip() for ln in got[got.index(next(g for g in got if g.startswith("failure"))):]] == shown
    readme = re.search(r"^clusterctl status vit-pretrain +# (\[hang\] .*)$", (REPO / "README.md").read_text(), re.M)
    assert readme and readme.group(1).endswith("(supervisor.stuck_timeout_s 20s)"), readme


def test_every_failure_class_is_documented_where_the_classes_are_listed():
    """oncall.md's 'Read the failure class' table and design.md's list name every class `status` shows (both
    lacked `straggler`, the verdict of `supervisor.stragglers: relaunch`)."""
    from clusterctl.views.status import FAILURE_KLASSES

    oncall = (REPO / "docs" / "oncall.md").read_text()
    table = oncall.split("| class | means | do |", 1)[1].split("\n\n", 1)[0]
    assert sorted(re.findall(r"^\s*\| `([a-z_]+)` \|", table, re.M)) == sorted(FAILURE_KLASSES)
    design = " ".join((REPO / "docs" / "design.md").read_text().split())
    listed = re.search(r"Failure classes \(`status`, `events`, \[docs/oncall\.md\]\(oncall\.md\)\): (.*?) The "
                       r"supervisor writes a heartbeat", design).group(1)
    assert [k for k in FAILURE_KLASSES if f"`{k}`" not in listed] == [], listed
    from clusterctl.store.state import JobState

    states = re.search(r"States: ([A-Z, ]+)\.", design).group(1)
    assert states.split(", ") == [s.value for s in JobState]


def test_job_md_names_every_variable_the_plan_gives_a_node(tmp_path):
    """docs/job.md 'What every node gets' names each variable of a node's environment in the plan (a guard)."""
    r = cli(tmp_path, "launch", str(REPO / "examples" / "quickstart" / "job.yaml"), "--dry-run", "-o", "json")
    env = json.loads(r.stdout)["nodes"][0]["env"]
    section = (REPO / "docs" / "job.md").read_text().split("## What every node gets", 1)[1].split("\n## ", 1)[0]
    own = {"OMP_NUM_THREADS"}                           # the quickstart job file's own env
    assert [k for k in env if k not in own and f"`{k}" not in section] == []
