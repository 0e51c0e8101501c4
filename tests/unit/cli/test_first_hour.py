"""The first hour (issue 39): what a new user trips over, as real `clusterctl` processes on the embedded default
(this machine, local connection, bare runtime); tables at COLUMNS 80, 120 and 200."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

BIN = str(Path(sys.executable).parent)


def cli(tmp_path, *args, env=None, cwd=None, columns=80, timeout=120):
    e = {**os.environ, "CLUSTERCTL_STATE_DIR": str(tmp_path / "state"), "COLUMNS": str(columns), **(env or {})}
    e.pop("CLUSTERCTL_INVENTORY", None)
    return subprocess.run([sys.executable, "-m", "clusterctl.cli", *args], capture_output=True, text=True,
                          env=e, cwd=cwd or tmp_path, timeout=timeout, stdin=subprocess.DEVNULL)


def write(tmp_path, name, text):
    (tmp_path / name).write_text(text)
    return tmp_path / name


def test_launch_attached_with_json_output_keeps_stdout_one_json_document(tmp_path):
    """Item 8: the streamed [node/rank] lines go to stderr with -o json; stdout parses as the final view."""
    write(tmp_path, "hello.py", "print('hello from the rank', flush=True)\n")
    write(tmp_path, "job.yaml", "name: hello\nscript: hello.py\n")
    r = cli(tmp_path, "launch", "job.yaml", "-o", "json",
            env={"PATH": BIN + os.pathsep + os.environ.get("PATH", "")})
    assert r.returncode == 0, r.stdout + r.stderr
    view = json.loads(r.stdout)
    assert view["state"] == "SUCCEEDED" and view["name"] == "hello"
    assert "[localhost/0] hello from the rank" in r.stderr


@pytest.mark.parametrize("args", [
    ["exec", "-i", "", "--limit", "", "--", "true"],
    ["exec", "--limit", "", "--", "true"],
    ["exec", "--limit", " , ", "--", "true"],
    ["exec", "-i", "", "--", "true"],
    ["exec", "--job", "", "--", "true"],
    ["exec", "--job", "j", "--node", "", "--", "true"],
    ["preflight", "--limit", ""],
    ["preflight", "-i", ""],
    ["logs", "j", "--node", ""],
    ["stacks", "j", "--node", ""],
    ["shell", "j", "--node", ""],
    ["resume", "j", "--exclude", ""],
    ["nodes", "-i", ""],
    ["--state-dir", "", "status"],
])
def test_an_empty_selection_value_is_a_usage_error_not_everywhere(tmp_path, args):
    """Item 5: `exec -i "$INV" --limit "$HOSTS"` with both unset must not run on every host."""
    marker = tmp_path / "ran"
    if args[-1] == "true":
        args = [*args[:-1], "touch", str(marker)]
    r = cli(tmp_path, *args)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "empty" in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert not marker.exists()


def _jobs_in_history(tmp_path):
    """Two finished jobs (the quick start on this machine; a long name on two long host names) and a failure on
    localhost, as `status` and `nodes` list them."""
    from clusterctl.store import paths
    from clusterctl.store.state import JobState, Store

    reasons = {"quickstart": "user_error: node localhost rank 0 exited with code 1: ValueError: the learning rate "
                             "must be positive, got -0.1 (train.py line 42)",
               "bert-finetune-large": "node gpu-node-018.example.org lost: unreachable for 30 s (ssh: connection "
                                      "timed out after 5 s)"}
    nodes = {"quickstart": ["localhost"], "bert-finetune-large": ["gpu-node-017.example.org",
                                                                  "gpu-node-018.example.org"]}
    ids = {}
    with Store(paths.db_path(paths.ensure_state_dir(tmp_path / "state"))) as s:
        for name in nodes:
            j = ids[name] = s.create_job(name, json.dumps({"spec": {}, "hosts": []}), None, None)
            s.start_attempt(j, 1, nodes[name][0], "r", nodes[name])
            s.set_state(j, JobState.STARTING)
            s.add_event(j, "verdict", reasons[name], klass="user_error", node=nodes[name][0], attempt=1)
            s.set_state(j, JobState.FAILED, reasons[name])
        s.cordon("localhost", "ECC errors on GPU 3 after the driver update of Tuesday, see ticket OPS-1234")
    return ids, nodes, reasons


@pytest.mark.parametrize("columns", [80, 120, 200])
def test_status_and_nodes_keep_host_names_and_job_ids_whole_at_every_width(tmp_path, columns):
    """Item 7: `localhost` was cut to `localho…` at 80 and `loca…` at 120, the reason stopped at ~60 characters
    with 100 columns free, `nodes` cut the job id."""
    ids, nodes, reasons = _jobs_in_history(tmp_path)
    r = cli(tmp_path, "status", columns=columns)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert all(len(ln) <= columns for ln in lines), r.stdout
    for name, job_id in ids.items():
        assert any(ln.startswith(job_id) for ln in lines), r.stdout           # the id whole, at a line's start
        row = r.stdout.split(job_id, 1)[1].split("\n")[0]
        assert f" {nodes[name][0]}" in row or f"nodes: {nodes[name][0]}" in r.stdout, r.stdout
    assert "localho…" not in r.stdout and "example.o…" not in r.stdout and "loca…" not in r.stdout
    for reason in reasons.values():     # free columns go to the reason: whole, or cut only at the line's end
        shown = next(ln for ln in lines if reason[:20] in ln)
        assert reason in " ".join(r.stdout.split()) or (shown.endswith("…") and len(shown) >= columns - 1), r.stdout
    n = cli(tmp_path, "nodes", columns=columns)
    assert n.returncode == 0, n.stderr
    assert all(len(ln) <= columns for ln in n.stdout.splitlines()), n.stdout
    assert ids["quickstart"] in n.stdout and "localhost" in n.stdout.split()
    assert "ECC errors on GPU 3 after the driver update" in n.stdout


def test_preflights_cluster_line_keeps_each_mark_with_its_label():
    from rich.console import Console

    from clusterctl.checks.report import render_table
    from clusterctl.checks.results import ClusterCheck, PreflightReport

    cluster = [ClusterCheck(f"cluster_check_number_{i}", "warn" if i % 2 else "pass", "d") for i in range(8)]
    for width in (40, 80, 120):
        console = Console(width=width, record=True, file=open(os.devnull, "w"), color_system=None)
        render_table(PreflightReport.build([], cluster, 0.1), console)
        text = console.export_text()
        block = text.split("cluster:", 1)[1].split("\n\n", 1)[0]
        lines = ("cluster:" + block).splitlines()
        assert all(len(ln) <= width for ln in lines), text
        for ln in lines:
            assert not ln.rstrip().endswith(("!", "✓")), text        # a mark never ends a line without its label
        assert sum(f"cluster_check_number_{i}" in text for i in range(8)) == 8


def test_an_alias_bomb_in_an_inventory_user_var_is_refused_at_its_line(tmp_path):
    """Item 12: 9 levels of 9 aliases in a free-form var: `inventory -o json` wrote 4.3 GB, `launch` hung."""
    levels = ["    l0: &l0 [x, x, x, x, x, x, x, x, x]"]
    for i in range(1, 10):
        levels.append(f"    l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 9)}]")
    write(tmp_path, "inventory.yaml", "all:\n  vars:\n" + "\n".join(levels)
          + "\n  hosts:\n    localhost:\n      clusterctl_connection: local\n      clusterctl_runtime: bare\n")
    for args in (["inventory", "-o", "json"], ["launch", "job.yaml", "--dry-run"]):
        write(tmp_path, "job.yaml", "name: j\nscript: t.py\n")
        r = cli(tmp_path, *args, timeout=30)
        assert r.returncode == 2, (args, r.stdout[:300], r.stderr)
        assert "inventory.yaml:" in r.stderr and "aliases" in r.stderr, r.stderr
        assert len(r.stdout) < 10_000


def _finished(tmp_path, name="done", lines=0):
    from clusterctl.store import paths
    from clusterctl.store.state import JobState, Store

    root = paths.ensure_state_dir(tmp_path / "state")
    with Store(paths.db_path(root)) as s:
        j = s.create_job(name, json.dumps({"spec": {"name": name, "script": "t.py"}, "hosts": []}), None, None)
        s.start_attempt(j, 1, "localhost", "r", ["localhost"])
        s.set_state(j, JobState.STARTING)
        s.set_state(j, JobState.SUCCEEDED, "every node finished with exit code 0")
    (paths.ensure_job_dir(root, j) / "output.log").write_text("".join(f"[localhost/0] line {i}\n"
                                                                       for i in range(lines)))
    return j


def test_logs_into_a_closed_pipe_exits_0_without_a_traceback(tmp_path):
    """Item 12: `clusterctl logs JOB | head -1` exited 1 (BrokenPipeError)."""
    job = _finished(tmp_path, lines=200_000)
    env = {**os.environ, "CLUSTERCTL_STATE_DIR": str(tmp_path / "state")}
    r = subprocess.run(["bash", "-c", f"set -o pipefail; {sys.executable} -m clusterctl logs {job} | head -1"],
                       capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0 and r.stdout == "[localhost/0] line 0\n", (r.returncode, r.stdout, r.stderr)
    assert r.stderr == "", r.stderr


@pytest.mark.parametrize("args,option", [
    (["logs", "JOB", "--tail", "99999999999999999999"], "--tail"),
    (["logs", "JOB", "--rank", "99999999999999999999"], "--rank"),
    (["logs", "JOB", "--attempt", "99999999999999999999"], "--attempt"),
    (["stop", "JOB", "--grace", "nan"], "--grace"),
    (["stop", "JOB", "--grace", "inf"], "--grace"),
    (["exec", "--timeout", "nan", "--", "true"], "--timeout"),
    (["exec", "--timeout", "inf", "--", "true"], "--timeout"),
])
def test_out_of_range_numbers_on_the_command_line_are_usage_errors(tmp_path, args, option):
    """Item 12: `--tail 99999999999999999999` was an internal error, `stop --grace nan` was accepted."""
    job = _finished(tmp_path, lines=3)
    r = cli(tmp_path, *[job if a == "JOB" else a for a in args])
    assert r.returncode == 2 and option in r.stderr, (r.returncode, r.stdout, r.stderr)
    assert "internal error" not in r.stderr and "Traceback" not in r.stderr


def test_a_mistyped_state_dir_is_not_created(tmp_path):
    """Item 12: `--state-dir /typo` was created (and the user saw "no jobs yet"); launch and cordon still create
    a new one (first use)."""
    typo = tmp_path / "stat"
    for args in (["--state-dir", str(typo), "status"], ["logs", "j", "--state-dir", str(typo)],
                 ["--state-dir", str(typo), "nodes"]):
        r = cli(tmp_path, *args)
        assert r.returncode == 2 and "does not exist" in r.stderr and str(typo) in r.stderr, r.stderr
        assert not typo.exists()
    for args in (["--state-dir", str(typo), "inventory"], ["--state-dir", str(typo), "schema"]):
        r = cli(tmp_path, *args)          # no job state read: a fresh dir is no typo to them, and stays uncreated
        assert r.returncode == 0 and not typo.exists(), r.stderr
    r = cli(tmp_path, "--state-dir", str(typo), "cordon", "localhost", "--reason", "first use")
    assert r.returncode == 0 and typo.is_dir(), r.stderr


def test_a_corrupt_or_empty_state_db_is_an_error_that_says_move_it_aside(tmp_path):
    """Item 12: garbage exited 1 with no hint; a 0-byte state.db silently became an empty history."""
    from clusterctl.store import paths

    db = paths.db_path(paths.ensure_state_dir(tmp_path / "state"))
    db.write_bytes(b"this is not a database " * 100)
    for args in (["status"], ["nodes"]):
        r = cli(tmp_path, *args)
        assert r.returncode == 2 and "move it aside" in r.stderr and str(db) in r.stderr, r.stderr
    db.write_bytes(b"")
    r = cli(tmp_path, "status")
    assert r.returncode == 2 and "0 bytes" in r.stderr and "move it aside" in r.stderr, r.stderr
    assert db.stat().st_size == 0                  # nothing written over it


@pytest.mark.parametrize("line,expected", [
    ("supervisor: {probe_interval_s: 1e300}", "write 1.0e300"),
    ("supervisor: {probe_interval_s: 5E-1}", "write 5.0E-1"),
    ("restarts: {max_failures: 1e3}", "write 1000"),
    ("supervisor: {probe_interval_s: .nan}", "must be a finite number, got nan"),
    ("supervisor: {probe_interval_s: .inf}", "must be a finite number, got inf"),
    ("supervisor: {probe_interval_s: abc}", "must be a number, got str 'abc'"),
])
def test_number_errors_in_the_job_file_say_what_to_write_in_our_words(tmp_path, line, expected):
    """Item 12: `1e300` is text to YAML 1.1 ("must be a number, got str" with no hint); pydantic's "Input should
    be a finite number" among our own wording."""
    write(tmp_path, "job.yaml", f"name: j\nscript: t.py\n{line}\n")
    r = cli(tmp_path, "validate", "job.yaml")
    assert r.returncode == 2 and "job.yaml:3:" in r.stderr and expected in r.stderr, r.stderr
    assert "Input should" not in r.stderr
    if "abc" in line:
        assert "write" not in r.stderr


@pytest.mark.parametrize("args,expected", [
    (["--nodes", "0"], "--nodes: must be >= 1, got 0"),
    (["--name", "Bad_Name"], "--name: "),
    (["--env", "1A=x"], "--env 1A: "),
    (["--nodes", "5"], "--nodes: the job needs at least 5 node(s) but the inventory <embedded default> offers 1"),
])
def test_a_bad_override_is_blamed_on_its_flag_not_the_job_files_first_line(tmp_path, args, expected):
    """Item 12: `launch --nodes 0` said `job.yaml:1: nodes: must be >= 1` (or the line of the file's own nodes:)."""
    write(tmp_path, "job.yaml", "name: j\nscript: t.py\nnodes: 1\n")
    r = cli(tmp_path, "launch", "job.yaml", "--dry-run", *args)
    assert r.returncode == 2 and expected in r.stderr, r.stderr
    assert "job.yaml:" not in r.stderr, r.stderr


@pytest.mark.parametrize("command", [["validate", "job.yaml"], ["launch", "job.yaml", "--dry-run"]])
def test_unset_secrets_are_reported_together_with_a_schema_error(tmp_path, command):
    """Item 12: validate and --dry-run named the unset secret only once the schema error was fixed."""
    write(tmp_path, "job.yaml", "name: j\nscript: t.py\nnodes: x\nsecret_env: [CC_TEST_UNSET_TOKEN]\n"
                                "notify:\n  - webhook_env: CC_TEST_UNSET_HOOK\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("CC_TEST_UNSET")}
    r = subprocess.run([sys.executable, "-m", "clusterctl", *command], capture_output=True, text=True, timeout=60,
                       cwd=tmp_path, env={**env, "CLUSTERCTL_STATE_DIR": str(tmp_path / "s")})
    assert r.returncode == 2, r.stderr
    assert "job.yaml:3: nodes:" in r.stderr, r.stderr
    assert "job.yaml:4: secret_env[0]: CC_TEST_UNSET_TOKEN is not set" in r.stderr, r.stderr
    assert "job.yaml:6: notify[0].webhook_env: CC_TEST_UNSET_HOOK is not set" in r.stderr, r.stderr


SYSTEM_PATH = "/usr/local/bin:/usr/bin:/bin"     # as after `make install`: clusterctl linked, its venv not on PATH


def test_a_local_launch_finds_the_torchrun_beside_clusterctls_interpreter(tmp_path):
    """Item 6: after `make install` only `clusterctl` is on PATH; the quick start's launch failed its preflight
    ("torchrun not found on localhost's PATH") although torch is installed beside clusterctl."""
    from shutil import which

    assert which("torchrun", path=SYSTEM_PATH) is None, "this test needs a PATH without torchrun"
    write(tmp_path, "hello.py", "print('hello from the rank', flush=True)\n")
    write(tmp_path, "job.yaml", "name: hello\nscript: hello.py\n")
    r = cli(tmp_path, "launch", "job.yaml", env={"PATH": SYSTEM_PATH})
    assert r.returncode == 0, r.stdout + r.stderr
    assert "[localhost/0] hello from the rank" in r.stdout
    v = cli(tmp_path, "validate", "job.yaml", env={"PATH": SYSTEM_PATH})
    assert v.returncode == 0 and "warning" not in v.stderr, v.stderr
    d = cli(tmp_path, "doctor", "-o", "json", env={"PATH": SYSTEM_PATH})
    found = [f for f in json.loads(d.stdout) if f["check"] == "torchrun"]
    assert found and found[0]["status"] == "pass" and found[0]["detail"].startswith(BIN), d.stdout


def test_validate_and_doctor_run_launchs_local_torchrun_check(tmp_path):
    """Item 6: validate, validate --strict and --dry-run passed where launch then failed its preflight."""
    write(tmp_path, "job.yaml", "name: hello\nscript: hello.py\ntorchrun: [no-such-torchrun]\n")
    v = cli(tmp_path, "validate", "job.yaml", env={"PATH": SYSTEM_PATH})
    assert v.returncode == 0 and "no-such-torchrun not found" in v.stderr, v.stderr
    assert "job.yaml:3: torchrun:" in v.stderr
    assert cli(tmp_path, "validate", "job.yaml", "--strict", env={"PATH": SYSTEM_PATH}).returncode == 2
    r = cli(tmp_path, "launch", "job.yaml", "--dry-run", env={"PATH": SYSTEM_PATH})
    assert r.returncode == 0 and "no-such-torchrun not found" in r.stderr, r.stderr
    empty = tmp_path / "bin"
    empty.mkdir()
    d = cli(tmp_path, "doctor", "-o", "json", env={"PATH": str(empty)})
    assert any(f["check"] == "torchrun" for f in json.loads(d.stdout)), d.stdout


def test_script_arguments_after_a_double_dash_follow_the_job_files_args(tmp_path):
    """Item 11: `launch job.yaml -- --lr 0.1` as torchrun takes them."""
    write(tmp_path, "job.yaml", "name: j\nscript: t.py\nargs: [--epochs, 3]\n")
    r = cli(tmp_path, "launch", "job.yaml", "--dry-run", "-o", "json", "--", "--lr", "0.10", "--name", "x y")
    assert r.returncode == 0, r.stderr
    plan = json.loads(r.stdout)
    text = json.dumps(plan["nodes"][0]["torchrun_argv"])
    assert text.index('"--epochs"') < text.index('"--lr"') and '"0.10"' in text and '"x y"' in text, text
    assert plan["job_id"] == "j-DRYRUN"                       # `--name` after `--` is the script's, not launch's
    r = cli(tmp_path, "launch", "job.yaml", "--dry-run", "--lr", "0.1")
    assert r.returncode == 2 and "arguments for the script go after `--`" in r.stderr, r.stderr


def test_a_unique_prefix_of_a_job_id_names_the_job_and_an_ambiguous_one_lists_the_candidates(tmp_path):
    """Item 11: as docker and git take an id's unique prefix."""
    first = _finished(tmp_path, name="bert", lines=1)
    second = _finished(tmp_path, name="bert", lines=1)
    other = _finished(tmp_path, name="vit", lines=1)
    r = cli(tmp_path, "status", "vi", "-o", "json")
    assert r.returncode == 0 and json.loads(r.stdout)["job_id"] == other, r.stderr
    r = cli(tmp_path, "logs", first[:-3])                 # all but the last hex digits: unique
    assert r.returncode == 0 and "[localhost/0] line 0" in r.stdout, r.stderr
    r = cli(tmp_path, "status", "bert-")
    assert r.returncode == 2 and first in r.stderr and second in r.stderr and other not in r.stderr, r.stderr
    assert "ambiguous" in r.stderr
    assert json.loads(cli(tmp_path, "status", "bert", "-o", "json").stdout)["job_id"] == second  # a name: newest
    assert cli(tmp_path, "status", "nope").returncode == 2


def test_common_ansible_vars_are_accepted_with_a_note(tmp_path):
    """Item 11: an Ansible inventory's ansible_python_interpreter / ansible_become were refused as unknown."""
    write(tmp_path, "inventory.yaml", "all:\n  vars:\n    ansible_python_interpreter: /usr/bin/python3\n"
                                      "    ansible_become: true\n  hosts:\n    node1:\n      ansible_host: 10.9.0.1\n"
                                      "      ansible_become_user: root\n    node2:\n      ansible_host: 10.9.0.2\n")
    r = cli(tmp_path, "inventory", "-o", "json")
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert [h["name"] for h in data["hosts"]] == ["node1", "node2"]
    notes = r.stderr.splitlines()
    assert len([n for n in notes if n.startswith("note: ")]) == 3, r.stderr         # once per var, not per host
    assert any("inventory.yaml:3: ansible_python_interpreter" in n for n in notes), r.stderr
    assert any("inventory.yaml:4: ansible_become" in n and "not" in n for n in notes), r.stderr
    assert {n["var"] for n in data["notes"]} == {"ansible_python_interpreter", "ansible_become",
                                                  "ansible_become_user"}
    write(tmp_path, "inventory.yaml", "all:\n  hosts:\n    node1:\n      ansible_bcome: true\n")
    r = cli(tmp_path, "inventory")
    assert r.returncode == 2 and "did you mean 'ansible_become'" in r.stderr, r.stderr


def test_the_rendezvous_exposure_warning_says_how_to_acknowledge_it_and_then_goes_away():
    """Item 12: every single-node local launch warned "runs code sent by anyone" with no way to act on it."""
    from clusterctl.checks.results import ClusterCheck, PreflightReport
    from clusterctl.config.spec import loads_job
    from clusterctl.usecases.lifecycle import launch_warnings

    report = PreflightReport.build([], [ClusterCheck("rendezvous_exposure", "warn", "localhost:29400 will listen on "
                                                     "all interfaces, including 192.0.2.2 (eth0)", "firewall TCP "
                                                     "29400", ("localhost",))], 0.1)
    (detail, hint), = launch_warnings(report, loads_job("name: j\nscript: t.py\n"))
    assert "192.0.2.2" in detail and "exposure_ok: true" in hint
    assert launch_warnings(report, loads_job("name: j\nscript: t.py\nrendezvous: {exposure_ok: true}\n")) == []


def test_version_is_accepted_after_a_subcommand_as_the_readme_says(tmp_path):
    """Item 13: the README lists --version among the global flags "accepted after the subcommand too"."""
    from clusterctl import __version__

    for args in (["--version"], ["status", "--version"], ["logs", "JOB", "--version"]):
        r = cli(tmp_path, *args)
        assert r.returncode == 0 and r.stdout.strip() == f"clusterctl {__version__}", (args, r.stdout, r.stderr)
    r = cli(tmp_path, "exec", "--", "printf", "%s\\n", "--version")       # after --: the remote command's
    assert r.returncode == 0 and "--version" in r.stdout and __version__ not in r.stdout, r.stdout + r.stderr


def test_forget_nodes_removes_the_jobs_node_side_directories(tmp_path):
    """Item 11: forgotten jobs left ~/.clusterctl/nodes/<node>/jobs/<job_id> on every node for good."""
    home = tmp_path / "home"
    home.mkdir()
    write(tmp_path, "hello.py", "print('hello', flush=True)\n")
    write(tmp_path, "job.yaml", "name: hello\nscript: hello.py\n")
    env = {"HOME": str(home)}
    assert cli(tmp_path, "launch", "job.yaml", env=env).returncode == 0
    kept = cli(tmp_path, "launch", "job.yaml", "-d", "-o", "json", env=env)
    assert kept.returncode == 0, kept.stderr
    jobs_dir = home / ".clusterctl" / "nodes" / "localhost" / "jobs"
    second = json.loads(kept.stdout)["job_id"]
    for _ in range(100):        # the detached one ends by itself
        if json.loads(cli(tmp_path, "status", second, "-o", "json").stdout)["state"] == "SUCCEEDED":
            break
    first, = [p.name for p in jobs_dir.iterdir() if p.name != second]
    assert (jobs_dir / second).is_dir()
    r = cli(tmp_path, "forget", first, env=env)
    assert r.returncode == 0 and (jobs_dir / first).is_dir()          # plain forget: the nodes are not touched
    r = cli(tmp_path, "forget", second, "--nodes", "-o", "json", env=env)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["forgotten"][0]["nodes_cleaned"] == ["localhost"]
    assert not (jobs_dir / second).exists() and (jobs_dir / first).is_dir()


def test_shell_completion_of_nodes_limits_and_files(tmp_path):
    """Item 13: --node, --limit and --exclude completed nothing; nor did JOB.yaml (no file completion)."""
    job = _finished(tmp_path, name="bert", lines=1)
    write(tmp_path, "inventory.yaml", "all:\n  hosts:\n    node1:\n    node2:\n")

    def complete(words):
        env = {"COMP_WORDS": words, "COMP_CWORD": str(len(words.split()) - (0 if words.endswith(" ") else 1)),
               "_CLUSTERCTL_COMPLETE": "bash_complete"}
        return cli(tmp_path, env=env).stdout.split()

    assert complete(f"clusterctl logs {job} --node lo") == ["plain,localhost"]      # the job's node
    assert complete("clusterctl exec --limit no") == ["plain,node1", "plain,node2"]  # ./inventory.yaml's hosts
    assert complete(f"clusterctl resume {job} --exclude ")[0] == "plain,localhost"   # the job's nodes first
    assert complete("clusterctl launch jo") == ["file,jo"]                           # the shell completes files
    assert complete("clusterctl exec -i inv") == ["file,inv"]
