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


def _section_range(lines: list[str], heading: str) -> tuple[int, int] | None:
    start = next((i for i, ln in enumerate(lines) if ln.rstrip() == heading), None)
    if start is None:
        return None
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
    return start, end


def read_subsection(heading: str, sub: str, doc: Path = DOC) -> str | None:
    """The ``sub`` (``### ...``) part of section ``heading``, up to the next ``###``/``##``; None when absent."""
    lines = doc.read_text().splitlines(keepends=True) if doc.exists() else []
    rng = _section_range(lines, heading)
    if rng is None:
        return None
    start = next((i for i in range(*rng) if lines[i].rstrip() == sub), None)
    if start is None:
        return None
    end = next((i for i in range(start + 1, rng[1]) if lines[i].startswith("### ")), rng[1])
    return "".join(lines[start:end]).rstrip("\n") + "\n"


def write_subsection(heading: str, sub: str, text: str, doc: Path = DOC) -> None:
    """``text`` (starting with ``sub``, a ``### ...`` line) replaces that part of section ``heading`` or is
    appended to the section (which is created when missing)."""
    whole = doc.read_text() if doc.exists() else HEADER
    lines = whole.splitlines(keepends=True)
    new = text.rstrip("\n") + "\n"
    rng = _section_range(lines, heading)
    if rng is None:
        write_section(heading, f"{heading}\n\n{new}", doc)
        return
    start = next((i for i in range(*rng) if lines[i].rstrip() == sub), None)
    if start is None:
        at = rng[1]
        while at > rng[0] + 1 and not lines[at - 1].strip():
            at -= 1
        lines[at:at] = ["\n", new]
    else:
        end = next((i for i in range(start + 1, rng[1]) if lines[i].startswith("### ")), rng[1])
        tail = "\n" if end < len(lines) else ""
        lines[start:end] = [new + tail]
    doc.write_text("".join(lines))
