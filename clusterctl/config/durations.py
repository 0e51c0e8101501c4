"""The one duration grammar: ``45s``, ``30m``, ``24h``, ``7d``, ``1w``, a bare number (seconds), decimals allowed
(``1.5h``). Used by the job file (``restarts.window``) and the command line (``status --since``). Pure."""
from __future__ import annotations

import re

UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*$")
EXAMPLES = "45s, 30m, 24h, 7d or 1w"


def seconds(text: str) -> float | None:
    """``"24h"`` -> 86400.0; None when ``text`` is not a duration."""
    m = _DURATION.match(text)
    return float(m.group(1)) * UNITS[m.group(2) or "s"] if m else None
