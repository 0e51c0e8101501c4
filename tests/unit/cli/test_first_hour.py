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
