"""YAML loading that remembers where every mapping key was, so errors can say ``FILE:LINE``.

``load_yaml_with_lines(path)`` returns plain Python values, except mappings are ``LineDict`` (a ``dict`` with a
``lines`` attribute: key -> 1-based line, and ``line``: the line the mapping starts on) and sequences are
``LineList`` (with ``lines``: index -> line). Duplicate keys and malformed YAML raise ``InputError``.
"""
from __future__ import annotations

import re
from typing import Any

import yaml

from clusterctl.errors import InputError


class LineDict(dict):
    line: int = 0
    lines: dict
    texts: dict      # key -> the source text of a number value (``1.10`` stays "1.10", ``0x1F`` "0x1F")


class LineList(list):
    line: int = 0
    lines: dict
    texts: dict      # index -> the source text of a number item


def number_text(node: Any, key: Any, value: Any) -> Any:
    """``value`` as written in the file when it is a YAML number (args and env keep ``1.10``, ``010``, ``0x1F``,
    ``3.0e-4`` as text; YAML would re-print them as 1.1, 8, 31, 0.0003), else ``value``."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return getattr(node, "texts", {}).get(key, value)
    return value


_NUMBER_TAGS = ("tag:yaml.org,2002:int", "tag:yaml.org,2002:float")
_MERGE_TAG = "tag:yaml.org,2002:merge"
MAX_MERGED_KEYS = 10_000   # keys one mapping may get from merge keys (``<<``)
_UNSIGNED_EXPONENT = re.compile(r"^[-+]?[0-9][0-9_]*\.[0-9_]*[eE][0-9]+$")
# what YAML 1.1 reads as text but a reader means as a number: 1e300, 5E-1 (no dot), 1.0e300 before this loader
EXPONENT_TEXT = re.compile(r"^[-+]?[0-9]+(\.[0-9]*)?[eE][-+]?[0-9]+$")


def _loader_for(file: str):
    class Loader(yaml.SafeLoader):
        def resolve(self, kind, value, implicit):
            """No YAML 1.1 base-60 numbers: ``nodes: 2:4`` stays "2:4" (not 124), as does ``1:30``. A float with an
            unsigned exponent (``1.0e300``, YAML 1.2) is a float, as ``1.0e+300`` is in YAML 1.1 (a number without
            a dot, ``1e300``, stays text in both PyYAML and this loader: its error says to write ``1.0e300``)."""
            tag = super().resolve(kind, value, implicit)
            if kind is yaml.ScalarNode and implicit[0] and tag in _NUMBER_TAGS and ":" in value:
                return "tag:yaml.org,2002:str"
            if kind is yaml.ScalarNode and implicit[0] and tag == "tag:yaml.org,2002:str" and \
                    _UNSIGNED_EXPONENT.match(value):
                return "tag:yaml.org,2002:float"
            return tag

        def flatten_mapping(self, node):
            """Merge keys (``<<: *anchor``, ``<<: [*a, *b]``) as PyYAML does, but whatever its version: each merged
            key node is taken once, so a 563-byte "merge bomb" (the same anchor merged again and again, nested)
            stays small (issue 24: PyYAML before 6.0.3 copied every pair each time: 428 MB), and a mapping gets at
            most ``MAX_MERGED_KEYS`` keys from merges."""
            merge, seen, index = [], set(), 0
            while index < len(node.value):
                key_node, value_node = node.value[index]
                if key_node.tag == _MERGE_TAG:
                    del node.value[index]
                    if isinstance(value_node, yaml.MappingNode):
                        sources = [value_node]
                    elif isinstance(value_node, yaml.SequenceNode) and all(
                            isinstance(n, yaml.MappingNode) for n in value_node.value):
                        sources = value_node.value
                    else:
                        raise InputError(file, key_node.start_mark.line + 1,
                                         "a merge key (<<) takes a mapping or a list of mappings")
                    for source in sources:
                        self.flatten_mapping(source)
                        for pair in source.value:
                            if id(pair[0]) not in seen:
                                seen.add(id(pair[0]))
                                merge.append(pair)
                        if len(merge) > MAX_MERGED_KEYS:
                            raise InputError(file, key_node.start_mark.line + 1,
                                             f"merge keys (<<) give this mapping more than {MAX_MERGED_KEYS} keys")
                elif key_node.tag == "tag:yaml.org,2002:value":
                    key_node.tag = "tag:yaml.org,2002:str"
                    index += 1
                else:
                    index += 1
            if merge:
                node.value = merge + node.value

    def construct_mapping(loader, node, deep=False):
        loader.flatten_mapping(node)
        out = LineDict()
        out.line, out.lines = node.start_mark.line + 1, {}
        out.texts = {}
        for key_node, value_node in node.value:
            if key_node.tag == "tag:yaml.org,2002:bool" and key_node.style is None:
                key = key_node.value   # a key `on:`/`yes:` is its text (YAML 1.1 would read the boolean True)
            else:
                key = loader.construct_object(key_node, deep=True)
            try:
                hash(key)
            except TypeError:
                raise InputError(file, key_node.start_mark.line + 1, "mapping key is not a scalar") from None
            if key in out:
                raise InputError(file, key_node.start_mark.line + 1, f"duplicate key {key!r}")
            out[key] = loader.construct_object(value_node, deep=True)
            out.lines[key] = key_node.start_mark.line + 1
            if isinstance(value_node, yaml.ScalarNode) and value_node.tag in _NUMBER_TAGS:
                out.texts[key] = value_node.value
        return out

    def construct_sequence(loader, node, deep=False):
        out = LineList(loader.construct_object(child, deep=True) for child in node.value)
        out.line = node.start_mark.line + 1
        out.lines = {i: child.start_mark.line + 1 for i, child in enumerate(node.value)}
        out.texts = {i: child.value for i, child in enumerate(node.value)
                     if isinstance(child, yaml.ScalarNode) and child.tag in _NUMBER_TAGS}
        return out

    Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, construct_mapping)
    Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_SEQUENCE_TAG, construct_sequence)
    return Loader


INI_HINT = ("clusterctl reads YAML inventories only (Ansible's YAML form), not the INI form. Instead of\n"
            "  [gpus]\n  node1 ansible_host=10.0.0.1\nwrite\n"
            "  all:\n    children:\n      gpus:\n        hosts:\n          node1:\n            ansible_host: 10.0.0.1\n"
            "(`ansible-inventory -i hosts.ini --list -y` converts one)")


def _looks_like_ini(text: str) -> bool:
    first = next((ln.strip() for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith(("#", ";"))),
                 "")
    return first.startswith("[") and first.endswith("]") and ":" not in first and "," not in first


def _why(e: yaml.MarkedYAMLError, text: str, line: int | None) -> str:
    """A malformed-YAML message a newcomer can act on."""
    problem = e.problem or e.context or ""
    if "'\\t'" in problem or "\t" in problem:
        return "a tab character: YAML indents with spaces only (replace the tabs with spaces)"
    if "another document" in problem:
        return ("a second YAML document (`---`) in the file: an inventory or job file is one document; remove "
                "the `---` line and what follows, or split them into two files")
    return f"malformed YAML: {problem}"


def loads(text: str, file: str) -> Any:
    if "\x00" in text:
        raise InputError(file, text[: text.index("\x00")].count("\n") + 1, "NUL byte in file")
    try:
        return yaml.load(text, Loader=_loader_for(file))  # noqa: S506 - SafeLoader subclass
    except InputError:
        raise
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        line = mark.line + 1 if mark else None
        if _looks_like_ini(text):
            raise InputError(file, None, INI_HINT) from None
        raise InputError(file, line, _why(e, text, line)) from None
    except yaml.YAMLError as e:
        raise InputError(file, None, f"malformed YAML: {e}") from None
    except (ValueError, OverflowError) as e:   # PyYAML's scanner on escapes out of range ("\U7fffffff")
        raise InputError(file, None, f"malformed YAML: {e}") from None
    except RecursionError:
        raise InputError(file, None, "malformed YAML: nested too deeply") from None


def load_yaml_with_lines(path: str) -> Any:
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except FileNotFoundError:
        raise InputError(path, None, "file not found") from None
    except UnicodeDecodeError as e:
        with open(path, "rb") as f:
            line = f.read()[: e.start].count(b"\n") + 1
        raise InputError(path, line, f"not UTF-8 (byte 0x{e.object[e.start]:02x}): save the file as UTF-8") from None
    except OSError as e:
        raise InputError(path, None, f"cannot read file: {e.__class__.__name__}: {getattr(e, 'strerror', None) or e}") from None
    return loads(text, path)


MAX_VALUE_ITEMS = 100_000   # items one value may hold once its YAML aliases are expanded (JSON output, records)


def expanded_items(value: Any) -> float:
    """How many keys and items ``value`` holds with every YAML alias written out, as JSON or a record would: each
    mapping/list is counted once and its count reused, so a few hundred bytes of aliases (9 levels of 9: 9^9
    items) are counted in linear time; a value that contains itself counts as infinite."""
    counts: dict[int, float] = {}

    def count(v: Any) -> float:
        if not isinstance(v, (dict, list)):
            return 1
        if id(v) in counts:
            return counts[id(v)]
        counts[id(v)] = float("inf")          # while counting: a cycle back to it is infinite
        children = [*v.keys(), *v.values()] if isinstance(v, dict) else v
        counts[id(v)] = 1 + sum(count(c) for c in children)
        return counts[id(v)]

    try:
        return count(value)
    except RecursionError:
        return float("inf")


def line_of(node: Any, key: Any = None) -> int | None:
    """Line of ``key`` in mapping/sequence ``node`` (or of the node itself)."""
    if key is not None and isinstance(node, (LineDict, LineList)):
        return node.lines.get(key, node.line or None)
    return getattr(node, "line", None) or None
