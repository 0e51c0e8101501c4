"""The README's quick start, verbatim (issue 27): the first command of its "Quick start" block, run as a new user
would in this clone (`make demo`: the embedded default, this machine, bare runtime), must train to the end."""
from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_the_readme_quick_start_runs_verbatim():
    readme = (REPO / "README.md").read_text()
    block = readme.split("## Quick start", 1)[1].split("```sh", 1)[1].split("```", 1)[0]
    first = block.strip().splitlines()[0].split("#", 1)[0].strip()
    assert first == "make demo", first
    env = {k: v for k, v in os.environ.items() if k not in ("CLUSTERCTL_INVENTORY", "CLUSTERCTL_STATE_DIR")}
    r = subprocess.run(first.split(), cwd=REPO, capture_output=True, text=True, timeout=900, env=env,
                       stdin=subprocess.DEVNULL)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-4000:]
    assert re.search(r"done: step \d+ loss", out) and "SUCCEEDED" in out, out[-4000:]
