"""Replace one `## ...` section of docs/benchmarks.md (shared by the bench scripts)."""
from __future__ import annotations

from pathlib import Path

DOC = Path(__file__).resolve().parent.parent / "docs" / "benchmarks.md"
HEADER = ("# Benchmarks\n\nOne `##` section per benchmark script in `bench/` (see bench/README.md). Each section "
          "says when and where it was measured and how to rerun it; rerunning a script replaces only its "
          "section.\n")


def write_section(heading: str, section: str, doc: Path = DOC) -> None:
    """``section`` (starting with ``heading``) replaces the section of that heading, or is appended."""
    text = doc.read_text() if doc.exists() else HEADER
    lines = text.splitlines(keepends=True)
    start = next((i for i, ln in enumerate(lines) if ln.rstrip() == heading), None)
    new = section.rstrip("\n") + "\n"
    if start is None:
        text = text.rstrip("\n") + "\n\n" + new
    else:
        end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
        tail = "".join(lines[end:])
        text = "".join(lines[:start]) + new + ("\n" + tail if tail else "")
    doc.write_text(text)
