"""The CLI as a new user meets it (issue 13 items 5, 6, 8): real `clusterctl` processes, no network (dry-runs,
the state DB, init). The testbed runs of the same commands are in tests/integration/test_toolkit_b.py."""
import json
import os
import subprocess
import sys

import pytest
import yaml

from clusterctl.config.spec import load_job
from clusterctl.store import paths
from clusterctl.store.state import JobState, Store

URL = "https://hooks.example.com/services/T000/B000/XXXXSECRET"


def cli(tmp_path, *args, env=None, cwd=None):
    e = {**os.environ, "CLUSTERCTL_STATE_DIR": str(tmp_path / "state"), "COLUMNS": "80", **(env or {})}
    e.pop("CLUSTERCTL_INVENTORY", None)
    return subprocess.run([sys.executable, "-m", "clusterctl.cli", *args], capture_output=True, text=True,
                          env=e, cwd=cwd or tmp_path, timeout=60, stdin=subprocess.DEVNULL)


@pytest.fixture
def inv(tmp_path):
    path = tmp_path / "inventory.yaml"
    path.write_text(yaml.safe_dump({"all": {"vars": {"clusterctl_runtime": "podman", "clusterctl_gpus": 0},
                                            "hosts": {f"node{i}": {"ansible_host": f"10.9.0.{i}"}
                                                      for i in range(1, 5)}}}))
    return path


def write_job(tmp_path, text):
    path = tmp_path / "job.yaml"
    path.write_text(text)
    return path


JOB = "name: demo\nscript: train.py\nnodes: \"2:3\"\n"


def test_init_writes_the_template_and_never_overwrites(tmp_path):
    r = cli(tmp_path, "init")
    assert r.returncode == 0, r.stderr
    text = (tmp_path / "job.yaml").read_text()
    assert "clusterctl launch job.yaml" in text and "clusterctl run" not in text
    assert load_job(str(tmp_path / "job.yaml")).name == "my-job"       # the template is a valid job as is
    (tmp_path / "job.yaml").write_text("mine")
    r = cli(tmp_path, "init")
    assert r.returncode == 2 and "already exists" in r.stderr and (tmp_path / "job.yaml").read_text() == "mine"
    assert cli(tmp_path, "init", "other.yaml").returncode == 0 and (tmp_path / "other.yaml").read_text() == text
    r = cli(tmp_path, "init", "-")
    assert r.returncode == 0 and r.stdout == text


def test_help_texts(tmp_path):
    assert "$CLUSTERCTL_STATE_DIR" in cli(tmp_path, "--help").stdout
    out = " ".join(cli(tmp_path, "resume", "--help").stdout.split())
    assert "--detach Return once the job is relaunched" in out.replace("-d, ", "")


def test_status_empty_says_how_to_launch(tmp_path):
    r = cli(tmp_path, "status")
    assert r.returncode == 0 and "clusterctl launch" in r.stderr and "clusterctl init" in r.stderr
    assert cli(tmp_path, "status", "--since", "2x").returncode == 2
    assert cli(tmp_path, "status", "--state", "done").returncode == 2
    assert cli(tmp_path, "status", "--watch").returncode == 2


def _finished_job(tmp_path, name, state=JobState.FAILED, reason="node node2 lost: unreachable " * 4):
    root = paths.ensure_state_dir(tmp_path / "state")
    with Store(paths.db_path(root)) as s:
        j = s.create_job(name, json.dumps({"spec": {"checkpoint": {"dir": str(tmp_path / "ckpt")}}, "hosts": []}),
                         None, None)
        s.start_attempt(j, 1, "node1", "r", ["node1", "node2"])
        s.set_state(j, JobState.STARTING)
        if state is not None:
            s.set_state(j, state, reason)
    d = paths.ensure_job_dir(root, j)
    (d / "output.log").write_text("[node1/0] hello\n")
    return j


def test_status_list_at_80_columns_keeps_the_job_id_and_one_line_reasons(tmp_path):
    done = _finished_job(tmp_path, "bert-ft")
    active = _finished_job(tmp_path, "bert-ft2", state=None)
    r = cli(tmp_path, "status")
    lines = r.stdout.splitlines()
    assert r.returncode == 0 and all(len(x) <= 80 for x in lines), r.stdout
    assert lines[0].split()[0] == "job" and "state" in lines[0].split()     # the name is in the full job id
    assert lines[1].startswith(active + " ") and any(x.startswith(done + " ") for x in lines)
    assert sum("node node2 lost" in x for x in lines) == 1
    j = json.loads(cli(tmp_path, "status", "-o", "json").stdout)["jobs"]
    assert [v["job_id"] for v in j] == [active, done]
    assert {"ended_at", "elapsed_s", "short_reason", "started_at", "nodes", "attempt"} <= set(j[1])
    only = json.loads(cli(tmp_path, "status", "--state", "failed", "-o", "json").stdout)["jobs"]
    assert [v["job_id"] for v in only] == [done]


def test_forget_deletes_records_and_logs_but_not_checkpoints_nor_active_jobs(tmp_path):
    ck = tmp_path / "ckpt" / "step-000000010"
    ck.mkdir(parents=True)
    done = _finished_job(tmp_path, "old")
    active = _finished_job(tmp_path, "live", state=None)
    root = tmp_path / "state"
    r = cli(tmp_path, "forget", done, active)
    assert r.returncode == 2 and "not forgetting active" in r.stderr and active in r.stderr
    assert (root / "jobs" / done).exists()                           # nothing was deleted
    r = cli(tmp_path, "forget", done)
    assert r.returncode == 0, r.stderr
    assert "checkpoints in" in r.stderr and ck.exists()
    assert not (root / "jobs" / done).exists() and (root / "jobs" / active).exists()
    assert cli(tmp_path, "status", done).returncode == 2
    with Store(paths.db_path(root)) as s:
        assert s.events(done) == [] and s.attempts(done) == []
    assert cli(tmp_path, "forget", "nope").returncode == 2


def test_cordon_nodes_and_launch_exclusion(tmp_path, inv):
    job = write_job(tmp_path, JOB)
    r = cli(tmp_path, "cordon", "node2", "node3", "--reason", "ECC errors")
    assert r.returncode == 0, r.stderr
    assert cli(tmp_path, "cordon", "node1").returncode == 2                   # --reason is required
    rows = json.loads(cli(tmp_path, "nodes", "-i", str(inv), "-o", "json").stdout)
    assert [(x["host"], x["state"], x["reason"]) for x in rows] == [
        ("node1", "ok", None), ("node2", "cordoned", "ECC errors"), ("node3", "cordoned", "ECC errors"),
        ("node4", "ok", None)]
    assert {"since", "jobs", "failures_7d", "last_failure"} <= set(rows[1])
    plan = cli(tmp_path, "launch", str(job), "-i", str(inv), "--dry-run")
    assert plan.returncode == 0, plan.stderr
    assert "excluded   node2: cordoned: ECC errors" in plan.stdout and "[node2]" not in plan.stdout
    p = json.loads(cli(tmp_path, "launch", str(job), "-i", str(inv), "--dry-run", "-o", "json").stdout)
    assert [n["host"] for n in p["nodes"]] == ["node1", "node4"]
    assert p["excluded"] == [{"host": "node2", "reason": "ECC errors"}, {"host": "node3", "reason": "ECC errors"}]
    cli(tmp_path, "cordon", "node4", "--reason", "fan")
    r = cli(tmp_path, "launch", str(job), "-i", str(inv), "--dry-run")
    assert r.returncode == 2 and "node4 (fan)" in r.stderr and "node2 (ECC errors)" in r.stderr
    assert cli(tmp_path, "uncordon", "node2", "node3", "node4").returncode == 0
    assert json.loads(cli(tmp_path, "nodes", "-i", str(inv), "-o", "json").stdout)[1]["state"] == "ok"


def test_spares_and_masked_webhook_in_the_plan(tmp_path, inv):
    job = write_job(tmp_path, JOB + f"hosts: [node1, node2, node3, node4]\nnotify:\n  - {{webhook: {URL}}}\n"
                                    "  - {command: [echo, hi], on: [succeeded]}\n")
    r = cli(tmp_path, "launch", str(job), "-i", str(inv), "--dry-run")
    assert r.returncode == 0, r.stderr
    assert "spares     node4" in r.stdout and "[node4]" not in r.stdout
    assert "notify     webhook *** on failed,recovering" in r.stdout and URL not in r.stdout + r.stderr
    js = cli(tmp_path, "launch", str(job), "-i", str(inv), "--dry-run", "-o", "json").stdout
    assert URL not in js and json.loads(js)["spares"] == ["node4"]


def test_container_wrapper_shown_in_full_and_bare_without_image(tmp_path, inv):
    r = cli(tmp_path, "launch", str(write_job(tmp_path, JOB)), "-i", str(inv), "--dry-run")
    assert "<script" not in r.stdout and "--volume=$d:/run/clusterctl-env" in r.stdout
    bare = write_job(tmp_path, "name: demo\nscript: train.py\n")
    (tmp_path / "empty").mkdir()
    r = cli(tmp_path, "launch", str(bare), "--dry-run", cwd=tmp_path / "empty")   # embedded default: bare
    assert r.returncode == 0, r.stderr
    assert "image" not in r.stdout and "clusterctl-demo-localhost" not in r.stdout.split("command")[0]


@pytest.mark.parametrize("text,where,message", [
    (JOB + "hosts:\n  - node1\n  - nod2\n", ":6: hosts[1]:", "no host or group 'nod2' in the inventory"),
    (JOB + "rendezvous:\n  port: 29400\n  host: node9\n", ":6: rendezvous.host:", "'node9' is not one of the job's hosts"),
    (JOB + "hosts: [node1, node2, node3, node4]\nrendezvous: {host: node4}\n", ":5: rendezvous.host:",
     "(it is a spare"),
])
def test_job_errors_name_the_line(tmp_path, inv, text, where, message):
    job = write_job(tmp_path, text)
    r = cli(tmp_path, "launch", str(job), "-i", str(inv), "--dry-run")
    assert r.returncode == 2 and f"{job}{where}" in r.stderr and message in r.stderr, r.stderr
    assert "Traceback" not in r.stderr
    if "nod2" in text:
        assert "did you mean 'node2'?" in r.stderr


def test_secret_env_unset_is_an_error_at_its_line_but_dry_run_needs_no_value(tmp_path, inv):
    job = write_job(tmp_path, JOB + "secret_env:\n  - WANDB_API_KEY\n  - HF_TOKEN\n"
                                    "notify:\n  - webhook_env: CC_TEST_HOOK\n")
    env = {"WANDB_API_KEY": "k1"}
    r = cli(tmp_path, "launch", str(job), "-i", str(inv), "--dry-run", env=env)
    assert r.returncode == 0 and "HF_TOKEN=***" in r.stdout and "k1" not in r.stdout
    r = cli(tmp_path, "launch", str(job), "-i", str(inv), "--skip-preflight", env=env)
    assert r.returncode == 2 and f"{job}:6: secret_env[1]: HF_TOKEN is not set" in r.stderr, r.stderr
    r = cli(tmp_path, "launch", str(job), "-i", str(inv), "--skip-preflight", env={**env, "HF_TOKEN": "x"})
    assert r.returncode == 2 and f"{job}:8: notify[0].webhook_env: CC_TEST_HOOK is not set" in r.stderr, r.stderr


@pytest.mark.parametrize("text,hint", [
    ("all:\n  hosts:\n    gpu[01-04]:\n", "ranges use ':', e.g. gpu[01:04]"),
    ("node1:\n  ansible_host: 10.0.0.1\n", "hosts go under `all: hosts:`"),
    ("- node1\n- node2\n", "hosts go under `all: hosts:`"),
])
def test_inventory_errors_with_hints(tmp_path, text, hint):
    path = tmp_path / "inv.yaml"
    path.write_text(text)
    r = cli(tmp_path, "inventory", "-i", str(path))
    assert r.returncode == 2 and f"{path}:" in r.stderr and hint in r.stderr, r.stderr


def test_inventory_table_at_80_columns(tmp_path):
    path = tmp_path / "inv.yaml"
    path.write_text(yaml.safe_dump({"all": {"vars": {"ansible_user": "mlops", "clusterctl_gpus": 8},
                                            "children": {"rack_a": {"hosts": {
                                                f"gpu{i:02d}": {"ansible_host": f"10.20.0.{i}",
                                                                "clusterctl_interface": "ens1f0np0"}
                                                for i in range(1, 4)}}}}}))
    r = cli(tmp_path, "inventory", "-i", str(path))
    lines = r.stdout.splitlines()
    assert r.returncode == 0 and all(len(x) <= 80 for x in lines[1:])      # [0]: the inventory's path
    assert lines[1].split() == ["host", "address", "port", "user", "connection", "runtime", "gpus", "interface",
                                "groups"]
    assert lines[2].split()[:2] == ["gpu01", "10.20.0.1"]


def test_a_failed_ssh_handshake_is_one_line_per_host_not_paramikos_traceback(tmp_path):
    """A host that accepts TCP and closes at once (sshd at MaxStartups, a port that is not SSH): paramiko logs
    'Error reading SSH protocol banner' with a traceback; the user sees the failure as the host's result only."""
    import socket
    import threading

    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    port = srv.getsockname()[1]
    stop = threading.Event()

    def serve():
        srv.settimeout(0.2)
        while not stop.is_set():
            try:
                c, _ = srv.accept()
                c.close()
            except OSError:
                pass

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    try:
        inv = tmp_path / "inventory.yaml"
        inv.write_text(yaml.safe_dump({"all": {"hosts": {"h1": {"ansible_host": "127.0.0.1", "ansible_port": port}}}}))
        r = cli(tmp_path, "exec", "-i", str(inv), "--", "true")
        assert r.returncode == 1, r.stdout + r.stderr
        assert "Traceback" not in r.stderr and "Exception (client)" not in r.stderr, r.stderr
        assert "h1" in r.stdout + r.stderr
    finally:
        stop.set()
        t.join()
        srv.close()


def test_dry_run_warns_of_every_problem_launch_would_refuse_and_strict_fails(tmp_path, inv):
    """An unset secret, an unset webhook variable and a missing key file: `launch` refuses them; the dry-run says
    each (a warning line naming the variable or file, never a value), exits 0, and 2 with --strict."""
    key_inv = tmp_path / "inv-key.yaml"
    data = yaml.safe_load(inv.read_text())
    data["all"]["vars"]["ansible_ssh_private_key_file"] = str(tmp_path / "no-such-key")
    key_inv.write_text(yaml.safe_dump(data))
    job = write_job(tmp_path, JOB + "secret_env: [HF_TOKEN]\nnotify:\n  - webhook_env: SLACK_URL\n")
    env_clean = {k: v for k, v in os.environ.items() if k not in ("HF_TOKEN", "SLACK_URL")}
    r = subprocess.run([sys.executable, "-m", "clusterctl.cli", "--state-dir", str(tmp_path / "s"), "launch",
                        str(job), "-i", str(key_inv), "--dry-run"], capture_output=True, text=True, timeout=60,
                       env={**env_clean, "COLUMNS": "80"}, stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stderr
    warnings = [ln for ln in r.stderr.splitlines() if ln.startswith("warning: ")]
    assert len(warnings) == 3, r.stderr
    assert "secret_env[0]: HF_TOKEN is not set" in warnings[0] and "job.yaml:4" in warnings[0]
    assert "SLACK_URL" in warnings[1]
    assert "no-such-key" in warnings[2] and "ansible_ssh_private_key_file" in warnings[2]
    r = subprocess.run([sys.executable, "-m", "clusterctl.cli", "--state-dir", str(tmp_path / "s"), "launch",
                        str(job), "-i", str(key_inv), "--dry-run", "--strict"], capture_output=True, text=True,
                       timeout=60, env={**env_clean, "COLUMNS": "80"}, stdin=subprocess.DEVNULL)
    assert r.returncode == 2 and r.stderr.count("warning: ") == 3


def test_stop_refuses_a_negative_grace(tmp_path):
    r = cli(tmp_path, "stop", "nojob", "--grace", "-5")
    assert r.returncode == 2 and "--grace" in r.stderr


def test_global_options_are_accepted_after_the_subcommand_too(tmp_path):
    from clusterctl.cli import hoist_globals

    assert hoist_globals(["status", "j", "--debug", "--state-dir", "/s"]) == ["--debug", "--state-dir", "/s",
                                                                              "status", "j"]
    assert hoist_globals(["exec", "--", "cmd", "--debug"]) == ["exec", "--", "cmd", "--debug"]
    assert hoist_globals(["logs", "j", "--state-dir=/s"]) == ["--state-dir=/s", "logs", "j"]
    (tmp_path / "s").mkdir()                  # an explicit --state-dir must exist (but for launch and cordon)
    r = subprocess.run([sys.executable, "-m", "clusterctl", "status", "--state-dir", str(tmp_path / "s"), "--debug",
                        "-o", "json"], capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "s" / "state.db").is_file()   # `python -m clusterctl` runs the CLI, the state dir given last


@pytest.mark.parametrize("name,content,expected", [
    ("hosts.ini", b"[gpus]\nnode1 ansible_host=10.0.0.1\n", "YAML inventories only"),
    ("tab.yaml", b"all:\n\thosts:\n", "tab.yaml:2: a tab character: YAML indents with spaces only"),
    ("latin.yaml", b"all:\n  hosts:\n    n\xe9:\n", "latin.yaml:3: not UTF-8 (byte 0xe9): save the file as UTF-8"),
    ("two.yaml", b"all:\n  hosts:\n    a:\n---\nall: {}\n", "two.yaml:4: a second YAML document"),
    ("pw.yaml", b"all:\n  hosts:\n    a:\n      ansible_password: x\n", "passwords are not supported"),
    ("gpus.yaml", b"all:\n  hosts:\n    a:\n      clusterctl_gpus: 100000\n", "must be a GPU count 0..64"),
])
def test_inventory_messages_a_newcomer_can_act_on(tmp_path, name, content, expected):
    (tmp_path / name).write_bytes(content)
    r = cli(tmp_path, "inventory", "-i", name)
    assert r.returncode == 2 and expected in r.stderr, r.stderr
    assert "did you mean 'ansible_port'" not in r.stderr and "Traceback" not in r.stderr


def test_nproc_per_node_has_an_upper_bound(tmp_path):
    write_job(tmp_path, "name: j\nscript: t.py\nnproc_per_node: 100000\n")
    r = cli(tmp_path, "launch", "job.yaml", "--dry-run")
    assert r.returncode == 2 and "job.yaml:3: nproc_per_node: must be a process count 1..256" in r.stderr


def test_cordon_warns_of_an_unknown_host_and_says_a_new_reason_replaces_the_old(tmp_path):
    r = cli(tmp_path, "cordon", "nodeX", "--reason", "bad disk")
    assert r.returncode == 0 and "nodeX is in no inventory" in r.stderr
    r = cli(tmp_path, "cordon", "nodeX", "--reason", "bad gpu")
    assert "already cordoned (bad disk): the new reason replaces it" in r.stderr
    r = cli(tmp_path, "cordon", "localhost", "--reason", "x")       # the embedded default's host: no warning
    assert "warning" not in r.stderr


def test_a_swapped_job_and_inventory_say_which_file_each_looks_like(tmp_path, inv):
    write_job(tmp_path, JOB)
    r = cli(tmp_path, "launch", str(inv), "-i", "job.yaml", "--dry-run")
    assert r.returncode == 2 and "looks like an inventory (it has `all:`), not a job file" in r.stderr
    r = cli(tmp_path, "launch", "job.yaml", "-i", "job.yaml", "--dry-run")
    assert r.returncode == 2 and "looks like a job file" in r.stderr


@pytest.mark.parametrize("doc,heading", [("README.md", "## Commands"), ("docs/oncall.md", "## Every command")])
def test_every_flag_the_readme_names_is_in_the_commands_help(doc, heading):
    """README's command table (and the full one in docs/oncall.md) and the CLI stay in step: each `--flag`/`-x` a
    row names is in that command's help."""
    import re
    from pathlib import Path

    from click.testing import CliRunner

    from clusterctl.cli import app

    readme = (Path(__file__).resolve().parents[3] / doc).read_text()
    table = next(p for p in readme.split(heading, 1)[1].split("\n\n") if p.startswith("| command"))
    checked = 0
    for row in table.splitlines()[2:]:
        cell = row.split("|")[1]
        for part in cell.split(" / "):
            m = re.search(r"`clusterctl ([a-z]+)|`([a-z]+) ", part)
            if not m:
                continue
            cmd = m.group(1) or m.group(2)
            help_text = CliRunner().invoke(app, [cmd, "--help"]).output
            assert f"Usage: app {cmd}" in help_text or f"{cmd} [OPTIONS]" in help_text, (cmd, help_text)
            for flag in re.findall(r"(?<![\w-])(--[a-z][a-z-]*|-[a-zA-Z])\b", part):
                assert flag in help_text, f"README names {flag} for `clusterctl {cmd}`, its --help does not"
                checked += 1
    assert checked > 30


def test_validate_checks_what_launch_checks_without_contacting_a_host(tmp_path, inv):
    write_job(tmp_path, JOB + "secret_env: [HF_TOKEN]\n")
    r = cli(tmp_path, "validate", "job.yaml", "-i", str(inv), env={"HF_TOKEN": "x"})
    assert r.returncode == 0 and "job.yaml: valid (3 node(s): node1, node2, node3)" in r.stderr, r.stderr
    env = {k: v for k, v in os.environ.items() if k != "HF_TOKEN"}
    r = subprocess.run([sys.executable, "-m", "clusterctl", "--state-dir", str(tmp_path / "s"), "validate",
                        "job.yaml", "-i", str(inv), "--strict", "-o", "json"], capture_output=True, text=True,
                       env=env, cwd=tmp_path, timeout=60)
    assert r.returncode == 2 and json.loads(r.stdout)["warnings"][0].startswith("job.yaml:4: secret_env[0]")
    write_job(tmp_path, "name: demo\nscript: train.py\nnodes: 9\n")
    r = cli(tmp_path, "validate", "job.yaml", "-i", str(inv))
    assert r.returncode == 2 and "nodes" in r.stderr


def test_the_shipped_json_schema_is_the_models_and_validates_the_template():
    from pathlib import Path

    from clusterctl.config.spec import json_schema

    shipped = json.loads((Path(__file__).resolve().parents[3] / "templates" / "job.schema.json").read_text())
    assert shipped == json.loads(json.dumps(json_schema()))
    assert {"name", "script", "nodes", "checkpoint", "restarts"} <= set(shipped["properties"])
    assert shipped["additionalProperties"] is False


def test_doctor_reports_key_permissions_and_the_state_dir(tmp_path):
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    key = home / ".ssh" / "id_ed25519"
    key.write_text("x")
    key.chmod(0o644)
    r = cli(tmp_path, "doctor", "-o", "json", env={"HOME": str(home), "SSH_AUTH_SOCK": str(tmp_path / "none")})
    found = {f["check"]: f for f in json.loads(r.stdout)}
    assert r.returncode == 1
    assert found["key_permissions"]["status"] == "fail" and "chmod 600" in found["key_permissions"]["hint"]
    assert found["ssh_agent"]["status"] == "fail" and found["state_dir"]["status"] == "pass"


def test_shell_completion_offers_job_and_host_names(tmp_path, inv):
    done = _finished_job(tmp_path, "bert-ft")
    env = {"COMP_WORDS": "clusterctl status be", "COMP_CWORD": "2", "_CLUSTERCTL_COMPLETE": "bash_complete"}
    r = cli(tmp_path, env=env)
    assert "plain,bert-ft" in r.stdout.splitlines() and f"plain,{done}" in r.stdout.splitlines()
    env = {"COMP_WORDS": "clusterctl cordon node", "COMP_CWORD": "2", "_CLUSTERCTL_COMPLETE": "bash_complete",
           "CLUSTERCTL_INVENTORY": str(inv)}
    r = cli(tmp_path, env=env)
    assert r.stdout.split() == [f"plain,node{i}" for i in range(1, 5)]


def test_launch_overrides_name_nodes_and_env_are_validated_like_the_file(tmp_path, inv):
    write_job(tmp_path, JOB + "env: {A: '1'}\n")
    r = cli(tmp_path, "launch", "job.yaml", "-i", str(inv), "--dry-run", "-o", "json", "--name", "other",
            "--nodes", "2", "--env", "LR=0.10", "--env", "A=2")
    assert r.returncode == 0, r.stderr
    plan = json.loads(r.stdout)
    assert plan["job_id"] == "other-DRYRUN" and len(plan["nodes"]) == 2
    assert plan["nodes"][0]["env"]["LR"] == "0.10" and plan["nodes"][0]["env"]["A"] == "2"
    r = cli(tmp_path, "launch", "job.yaml", "-i", str(inv), "--dry-run", "--nodes", "x")
    assert r.returncode == 2 and "nodes: must be a node count" in r.stderr
    r = cli(tmp_path, "launch", "job.yaml", "-i", str(inv), "--dry-run", "--env", "novalue")
    assert r.returncode == 2 and "expected K=V" in r.stderr


def test_an_unsupervised_job_in_the_list_says_so_in_words_not_a_bang(tmp_path):
    active = _finished_job(tmp_path, "bert-ft2", state=None)        # STARTING, no supervisor ever claimed it
    with Store(paths.db_path(tmp_path / "state")) as s:
        s.set_state(active, JobState.RUNNING)
        s.claim_supervisor(active, 999_999_999)                      # a pid that is not alive
        s.heartbeat(active, 999_999_999)
    r = cli(tmp_path, "status", env={"COLUMNS": "200"})
    row = next(ln for ln in r.stdout.splitlines() if ln.startswith(active))
    assert " RUNNING " in row and "RUNNING!" not in row
    assert "UNSUPERVISED: no supervisor; `clusterctl resume bert-ft2`" in row
    assert r.stderr.startswith("UNSUPERVISED: job " + active)
