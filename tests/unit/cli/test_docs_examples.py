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
            helps[cmd] = CliRunner().invoke(app, [cmd, "--help"] if cmd else ["--help"]).output
        assert "Usage:" in helps[cmd], f"{where}: `clusterctl {text}`: no command {cmd!r}"
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


@pytest.mark.parametrize("doc", ["README.md", *(f"docs/{p.name}" for p in sorted((REPO / "docs").glob("*.md")))])
def test_documented_job_ids_have_the_clis_shape(doc):
    """Job ids in examples are `<name>-<YYYYMMDD-HHMMSS>-<12 hex>` as the CLI makes them (not 4 hex digits)."""
    text = (REPO / doc).read_text()
    ids = re.findall(r"\b[a-z0-9-]+-20\d{6}-\d{6}-[0-9a-f]+\b", text)
    short = sorted({i for i in ids if len(i.rsplit("-", 1)[1]) != 12})
    assert not short, f"{doc}: job ids with a suffix other than 12 hex digits: {short[:5]}"
