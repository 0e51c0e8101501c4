"""Plain tables that fit a terminal width without dropping a column or cutting a value another command needs.

rich's Table, when a table is too wide, collapses wrappable columns to nothing and cuts ``no_wrap`` ones; here
every column keeps at least its ``min`` width, fixed columns (``min`` None: job ids, states) are never cut, and
the flexible ones shrink in the order given, ending in ``…``. Pure: lines in, lines out.
"""
from __future__ import annotations

import textwrap
from dataclasses import dataclass, replace
from typing import Sequence


@dataclass(frozen=True)
class Column:
    header: str
    min: int | None = None        # None: never shrunk (the value is needed whole)
    max: int | None = None        # cap even when there is room
    right: bool = False
    short: str | None = None      # header used when the table is too wide (e.g. "att" for "attempt")
    optional: bool = False        # left out before the table is stacked (its value is shown elsewhere in the row)


def cut(text: str, width: int) -> str:
    return text if len(text) <= width else (text[: width - 1] + "…" if width > 1 else text[:width])


def fit(columns: Sequence[Column], rows: Sequence[Sequence[str]], width: int,
        shrink_order: Sequence[tuple[int, int]] = (), spill: int | None = None) -> list[str]:
    """``_fit_spill``; when that still does not fit, the ``optional`` columns are left out; when even that does
    not fit, every row becomes a block (``stack``)."""
    lines = _fit_spill(columns, rows, width, shrink_order, spill)
    keep = [i for i, c in enumerate(columns) if not c.optional]
    if len(keep) < len(columns) and any(len(line) > width for line in lines):
        narrow = [columns[i] for i in keep]
        order = [(keep.index(i), w) for i, w in shrink_order if i in keep]
        lines = _fit_spill(narrow, [[r[i] for i in keep] for r in rows], width, order,
                           keep.index(spill) if spill in keep else None)
    if any(len(line) > width for line in lines):
        return stack(columns, rows, width)
    return lines


def _fit_spill(columns: Sequence[Column], rows: Sequence[Sequence[str]], width: int,
               shrink_order: Sequence[tuple[int, int]] = (), spill: int | None = None) -> list[str]:
    """Like ``_fit``; when even the narrowest table is wider than ``width``, column ``spill`` (a long free text,
    e.g. a reason) leaves the table and goes, cut to one line, under each row."""
    rows = [[" ".join(str(v).split()) for v in r] for r in rows]
    if spill is not None:
        narrowest = sum(c.min or max([len(c.header), *(len(r[i]) for r in rows)]) for i, c in enumerate(columns))
        if narrowest + len(columns) - 1 > width:
            keep = [i for i in range(len(columns)) if i != spill]
            order = [(keep.index(i), w) for i, w in shrink_order if i != spill]
            narrow = [replace(columns[i], header=columns[i].short or columns[i].header,
                              min=None if columns[i].min is None else min(columns[i].min, len(columns[i].short or
                                                                                               columns[i].header)))
                      for i in keep]
            table = _fit(narrow, [[r[i] for i in keep] for r in rows], width, order)
            out = [table[0]]
            for line, r in zip(table[1:], rows):
                out.append(line)
                if r[spill]:
                    out.append("  " + cut(r[spill], max(10, width - 2)))
            return out
    return _fit(columns, rows, width, shrink_order)


def stack(columns: Sequence[Column], rows: Sequence[Sequence[str]], width: int) -> list[str]:
    """A table too wide even with every flexible column at its minimum (long host or job names at 80 columns):
    each row as a block, its first value whole on a line of its own, then ``header: value`` pairs wrapped to
    ``width`` (a pair is never split; one longer than the width is wrapped on lines of its own)."""
    out = []
    for r in rows:
        values = [" ".join(str(v).split()) for v in r]
        out.append(values[0])
        line = ""
        for c, v in zip(columns[1:], values[1:]):
            if not v:
                continue
            pair = f"{c.header}: {v}"
            if len(pair) > width - 2:        # a long value (a reason) gets lines of its own, wrapped
                if line:
                    out.append(line)
                out.extend(textwrap.wrap(pair, width, initial_indent="  ", subsequent_indent="    "))
                line = ""
                continue
            if line and len(line) + 2 + len(pair) > width:
                out.append(line)
                line = ""
            line += "  " + pair
        if line.strip():
            out.append(line)
    return out


def _fit(columns: Sequence[Column], rows: Sequence[Sequence[str]], width: int,
         shrink_order: Sequence[tuple[int, int]] = ()) -> list[str]:
    """The table as lines of at most ``width`` characters when the fixed columns allow it (one space between
    columns). Flexible columns shrink step by step as ``shrink_order`` says ((index, down to) pairs), then each
    to its ``min``."""
    rows = [[" ".join(str(v).split()) for v in r] for r in rows]     # one line per value
    widths = []
    for i, c in enumerate(columns):
        w = max([len(c.header), *(len(r[i]) for r in rows)])
        widths.append(min(w, c.max) if c.max else w)
    excess = sum(widths) + len(columns) - 1 - width
    order = [*shrink_order, *((i, c.min) for i, c in enumerate(columns) if c.min is not None)]
    for i, down_to in order:
        if excess <= 0:
            break
        if columns[i].min is None:
            continue
        floor = max(down_to, columns[i].min, 1)
        take = min(excess, max(0, widths[i] - floor))
        widths[i] -= take
        excess -= take

    def line(values: Sequence[str]) -> str:
        cells = [cut(v, w).rjust(w) if c.right else cut(v, w).ljust(w) for v, w, c in zip(values, widths, columns)]
        return " ".join(cells).rstrip()

    return [line([c.header for c in columns]), *(line(r) for r in rows)]
