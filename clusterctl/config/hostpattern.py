"""``--limit PATTERN``: which inventory hosts a command runs on (pure).

A pattern is a comma-separated list of host names, group names, the inventory's own ranges (``gpu[01:04]``,
``n[a:c]``, ``n[0:10:2]``: the same syntax as host names in the inventory) and the globs ``*`` and ``?`` (``gpu*``,
``rack?``), matched against host *and* group names. Hosts come back in inventory order, each once. A shell-style
class such as ``gpu[1-4]`` is refused with the range that means it (``gpu[1:4]``). As in Ansible, ``:`` also
separates parts (outside a range's brackets), ``&part`` keeps only the hosts it also names and ``!part`` removes
the hosts it names (``train:&rack_b:!gpu03``; only ``!`` parts: from every host).
"""
from __future__ import annotations

import fnmatch
from typing import TYPE_CHECKING

from clusterctl.errors import UserError

if TYPE_CHECKING:
    from clusterctl.config.inventory import Host, Inventory

GLOB_CHARS = "*?"


def split(pattern: str) -> list[str]:
    """The parts of a pattern: separated by ``,`` or, as in Ansible, ``:`` (not the ``:`` inside a range's
    brackets)."""
    parts, depth, current = [], 0, ""
    for c in pattern:
        depth += (c == "[") - (c == "]")
        if c == "," or (c == ":" and depth <= 0):
            parts.append(current)
            current = ""
        else:
            current += c
    return [p.strip() for p in [*parts, current] if p.strip()]


def select(inventory: "Inventory", pattern: str | None) -> list["Host"]:
    """The hosts ``pattern`` names (every host when it is None). An empty pattern (an unset variable) is an error,
    never "everywhere"; so is a part that names nothing (exit 2, listing what exists)."""
    if pattern is None:
        return list(inventory.hosts)
    if not split(pattern):
        raise UserError(f"--limit {pattern!r} is empty (an unset variable?): name hosts or groups, or leave it out")
    names = [h.name for h in inventory.hosts]
    chosen: set[str] = set()
    parts = split(pattern)
    for part in parts:       # Ansible's order: the union of the plain parts, then each &part, then each !part
        word = part[1:].strip() if part[0] in "!&" else part
        hits = _match(inventory, names, word) if word else set()
        if not hits:
            groups = ", ".join(g for g in inventory.groups if g != "all") or "none"
            raise UserError(f"--limit {part!r} matches no host or group of {inventory.source} "
                            f"(hosts: {', '.join(names[:20])}{' ...' if len(names) > 20 else ''}; groups: {groups})")
        if part[0] not in "!&":
            chosen.update(hits)
    if not any(p[0] not in "!&" for p in parts):
        chosen = set(names)                               # only & and !: of every host
    for part in parts:
        if part[0] == "&":
            chosen &= _match(inventory, names, part[1:].strip())
    for part in parts:
        if part[0] == "!":
            chosen -= _match(inventory, names, part[1:].strip())
    if not chosen:
        raise UserError(f"--limit {pattern!r} leaves no host of {inventory.source}")
    return [h for h in inventory.hosts if h.name in chosen]


def _match(inventory: "Inventory", names: list[str], part: str) -> set[str]:
    from clusterctl.config.inventory import DASH_RANGE_RE, RANGE_RE, expand_range

    if RANGE_RE.search(part):
        try:
            expanded = expand_range(part)
        except ValueError as e:
            raise UserError(f"--limit {part!r}: {e}") from None
        return set().union(*(_match(inventory, names, p) for p in expanded))
    if "[" in part:
        m = DASH_RANGE_RE.search(part)
        fix = part[: m.start()] + f"[{m.group(1)}:{m.group(2)}]" + part[m.end():] if m else None
        raise UserError(f"--limit {part!r}: ranges are written as in the inventory, [FIRST:LAST]"
                        + (f": {fix!r}" if fix else ""))
    if any(c in part for c in GLOB_CHARS):
        hits = {n for n in names if fnmatch.fnmatchcase(n, part)}
        for g, members in inventory.groups.items():
            if fnmatch.fnmatchcase(g, part):
                hits.update(members)
        return hits
    if part in inventory.groups:
        return set(inventory.groups[part])
    return {part} if part in names else set()
