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
    optional: bool = False        # left out before a long value spills (its value is shown elsewhere in the row)
    items: bool = False           # a comma list of names (hosts): cut between whole names, "a,b,+3", never in one


def cut(text: str, width: int) -> str:
    return text if len(text) <= width else (text[: width - 1] + "…" if width > 1 else text[:width])


def cut_items(text: str, width: int) -> str:
    """``a,b,c,d`` in ``width``: as many whole names as fit, then ``+N`` for the rest (``a,b,+2``); the first name
    always whole (``floor`` gives the width that needs)."""
    names = text.split(",")
    if len(text) <= width or len(names) == 1:
        return text
    for k in range(len(names) - 1, 0, -1):
        shown = ",".join([*names[:k], f"+{len(names) - k}"])
        if len(shown) <= width:
            return shown
    return f"{names[0]},+{len(names) - 1}"


def floor(column: Column, values: Sequence[str]) -> int | None:
    """The narrowest a column may get: None (never shrunk), its ``min``, or for ``items`` the widest first name
    with its ``+N``."""
    if column.min is None:
        return None
    if column.items:
        return max([column.min, *(len(cut_items(v, 0)) for v in values)])
    return column.min


def _cell(column: Column, value: str, width: int) -> str:
    return cut_items(value, width) if column.items else cut(value, width)


def fit(columns: Sequence[Column], rows: Sequence[Sequence[str]], width: int,
        shrink_order: Sequence[tuple[int, int]] = (), spill: int | None = None) -> list[str]:
    """The first of these that fits ``width``: every column; without the ``optional`` ones; every column with the
    ``spill`` column under each row; without the optional ones and spilled. Else every row becomes a block
    (``stack``). Values a command needs whole (ids, host names) are never cut; room left goes to the last
    flexible column (a reason)."""
    rows = [[" ".join(str(v).split()) for v in r] for r in rows]     # one line per value
    keep = [i for i, c in enumerate(columns) if not c.optional]
    tries = [list(range(len(columns)))] + ([keep] if len(keep) < len(columns) else [])
    for how in ("whole", "shrunk", "spilled"):      # nothing cut (an optional column rather than a reason), ...
        if how == "spilled" and spill is None:
            break
        for idx in tries:
            cols = [columns[i] for i in idx]
            table = [[r[i] for i in idx] for r in rows]
            order = [(idx.index(i), w) for i, w in shrink_order if i in idx]
            if how == "spilled":
                lines = _fit_spill(cols, table, width, order, idx.index(spill) if spill in idx else None)
            elif _narrowest(cols, table, whole=how == "whole") <= width:
                lines = _fit(cols, table, width, order)
            else:
                continue
            if all(len(line) <= width for line in lines):
                return lines
    return stack(columns, rows, width)


def _narrowest(columns: Sequence[Column], rows: Sequence[Sequence[str]], whole: bool = False) -> int:
    """The table's narrowest width: every column at its floor (``whole``: at its widest value, within ``max``)."""
    def widest(i: int, c: Column) -> int:
        return max([len(c.header), *(len(_cell(c, r[i], c.max) if c.max else r[i]) for r in rows)])

    return sum(widest(i, c) if whole else floor(c, [r[i] for r in rows]) or widest(i, c)
               for i, c in enumerate(columns)) + len(columns) - 1


def _fit_spill(columns: Sequence[Column], rows: Sequence[Sequence[str]], width: int,
               shrink_order: Sequence[tuple[int, int]] = (), spill: int | None = None) -> list[str]:
    """Like ``_fit``; when even the narrowest table is wider than ``width``, column ``spill`` (a long free text,
    e.g. a reason) leaves the table and goes, cut to one line, under each row."""
    rows = [[" ".join(str(v).split()) for v in r] for r in rows]
    if spill is not None:
        if _narrowest(columns, rows) > width:
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
    widths, floors = [], []
    for i, c in enumerate(columns):
        w = max([len(c.header), *(len(_cell(c, r[i], c.max) if c.max else r[i]) for r in rows)])
        floors.append(floor(c, [r[i] for r in rows]))
        widths.append(max(min(w, c.max), floors[i] or 0) if c.max else w)
    excess = sum(widths) + len(columns) - 1 - width
    order = [*shrink_order, *((i, c.min) for i, c in enumerate(columns) if c.min is not None)]
    for i, down_to in order:
        if excess <= 0:
            break
        if floors[i] is None:
            continue
        lowest = max(down_to, floors[i], 1)
        take = min(excess, max(0, widths[i] - lowest))
        widths[i] -= take
        excess -= take

    def line(values: Sequence[str]) -> str:
        cells = [_cell(c, v, w).rjust(w) if c.right else _cell(c, v, w).ljust(w)
                 for v, w, c in zip(values, widths, columns)]
        return " ".join(cells).rstrip()

    return [line([c.header for c in columns]), *(line(r) for r in rows)]
