"""The first hour (``cli.setup``): ``doctor``."""
from __future__ import annotations

from pathlib import Path
from typing import Mapping


def doctor(state_dir: str | None, environ: Mapping[str, str], home: Path) -> list:
    """``doctor``: this machine as clusterctl needs it (``views.doctor.Finding`` per check)."""
    from clusterctl.store import paths
    from clusterctl.views import doctor as doctor_mod

    return doctor_mod.diagnose(paths.state_dir(state_dir), environ, home)
