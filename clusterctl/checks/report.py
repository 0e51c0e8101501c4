"""Rendering a PreflightReport with rich: hosts x checks table, one line per problem, a summary; progress."""
from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

from rich.columns import Columns
from rich.console import Console
from rich.padding import Padding
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from clusterctl.checks.registry import ENTRY_CHECKS, HOST_CHECKS, LABELS
from clusterctl.checks.results import PreflightReport

CELLS = {"pass": ("✓", "green"), "warn": ("!", "yellow"), "fail": ("✗", "bold red"), "skip": ("–", "dim")}
# Column headers (LABELS, from each check's record): short enough that a full table fits 80 columns (full ids
# would be truncated to "gpu_…"); the problem lines below the table use the full check ids.


def _cell(status: str) -> Text:
    sym, style = CELLS[status]
    return Text(sym, style=style)


def _fits(report: PreflightReport, ids: list[str], width: int) -> bool:
    """Whether the hosts x checks table fits ``width`` with every host name and header whole."""
    host_w = max([4, *(len(h.host) for h in report.hosts)])
    return host_w + sum(len(LABELS.get(cid, cid)) + 1 for cid in ids) <= width


def _render_stacked(report: PreflightReport, ids: list[str], console: Console) -> None:
    """Too narrow for the table (many checks, long host names, 80 columns): a block per host, its name whole on
    a line of its own, then its checks as ``✓ label`` pairs, wrapped to the width."""
    for h in report.hosts:
        console.print(Text(h.host, style="bold"))
        cells = [_cell(c.status) + Text(f" {LABELS.get(cid, cid)}") for cid in ids if (c := h.get(cid))]
        console.print(Padding(Columns(cells, padding=(0, 2)), (0, 0, 0, 2)), soft_wrap=False)


def render_table(report: PreflightReport, console: Console) -> None:
    ids = [cid for cid in HOST_CHECKS + ENTRY_CHECKS if any(h.get(cid) for h in report.hosts)]
    if not _fits(report, ids, console.width):
        _render_stacked(report, ids, console)
        ids = []
    table = Table(box=None, pad_edge=False, collapse_padding=True, header_style="bold")
    table.add_column("host", no_wrap=True)
    for cid in ids:
        table.add_column(LABELS.get(cid, cid), justify="center", no_wrap=True)
    for h in report.hosts:
        row = [Text(h.host)]
        for cid in ids:
            c = h.get(cid)
            row.append(_cell(c.status) if c else Text(""))
        table.add_row(*row)
    if ids:
        console.print(table)
    if report.cluster:   # packed here, not by rich: rich breaks a line between a mark and its label
        lines = [Text("cluster:", style="bold")]
        for c in report.cluster:
            item = _cell(c.status) + Text(f" {c.id}")
            if len(lines[-1]) + 2 + len(item) > console.width and len(lines[-1].plain.strip()) > len("cluster:"):
                lines.append(Text(" " * len("cluster:")))
            lines[-1] += Text(" " if lines[-1].plain.strip() in ("", "cluster:") else "  ") + item
        for line in lines:
            console.print(line, soft_wrap=True)
    problems = report.failures()
    if problems:
        console.print()
    for where, c in problems:
        sym, style = CELLS[c.status]
        line = Text(f"{sym} ", style=style) + Text(f"{where} ", style="bold") + Text(f"{c.id}: {c.detail}")
        if c.hint:
            line += Text(f"\n    → {c.hint}", style="cyan")
        console.print(line)
    s = report.summary
    verdict = Text("preflight passed" if report.ok else "preflight failed",
                   style="bold green" if report.ok else "bold red")
    warnings = "1 warning" if s["warn"] == 1 else f"{s['warn']} warnings"
    console.print(verdict + Text(f": {s['pass']} passed, {warnings}, {s['fail']} failed, "
                                 f"{s['skip']} skipped in {report.duration_s:.1f}s"))


@contextmanager
def progress_display(console: Console | None = None) -> Iterator:
    """A rich progress bar (on stderr by default) and the ``progress(done, total, label)`` callback that drives
    it: ``with progress_display() as cb: run_preflight(..., progress=cb)``."""
    console = console or Console(stderr=True)
    with Progress(TextColumn("preflight"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.description}"),
                  TimeElapsedColumn(), console=console, transient=True) as bar:
        task = bar.add_task("", total=None)

        def update(done: int, total: int, label: str) -> None:
            bar.update(task, completed=done, total=total, description=label)

        yield update
