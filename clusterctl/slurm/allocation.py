"""Slurm as inventory and node health: ``-i slurm`` and ``scontrol update ... State=DRAIN``.

``-i slurm`` (or ``-i slurm:OVERLAY.yaml``, or ``-i slurm`` with ``$CLUSTERCTL_SLURM_OVERLAY``) resolves the
hosts of the allocation this process runs in: names from ``scontrol show hostnames $SLURM_JOB_NODELIST`` (in
allocation order: the first is the rendezvous host), addresses (``NodeAddr``) and GPUs (``Gres=gpu:N``) from
``scontrol -o show node``, GPUs from ``$SLURM_GPUS_ON_NODE`` when the allocation has it. The connection
defaults to ``srun``. The overlay is an inventory YAML of the usual shape whose ``all: vars:`` (and groups'
vars) apply to every allocated host and whose ``hosts:`` entries add per-host vars; it lists no hosts of its
own (a host it names that is not in the allocation is an error at its line). Its values win over what the
allocation says.

Commands go through ``run_cmd`` (argv list, timeout) so tests give the parsers their golden text.
"""
from __future__ import annotations

import os
import re
import subprocess
from typing import Any, Callable, Iterable, Mapping, Sequence

from clusterctl.config import inventory
from clusterctl.config.inventory import SLURM_SOURCE, Inventory, is_slurm_source  # noqa: F401 - is_slurm_source: callers' name
from clusterctl.config.yamlfile import line_of, load_yaml_with_lines
from clusterctl.errors import InputError, UserError

OVERLAY_ENV = "CLUSTERCTL_SLURM_OVERLAY"
SCONTROL_TIMEOUT_S = 20.0

RunCmd = Callable[[Sequence[str], float], "subprocess.CompletedProcess[str]"]


def run_cmd(argv: Sequence[str], timeout: float = SCONTROL_TIMEOUT_S) -> "subprocess.CompletedProcess[str]":
    try:
        return subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise UserError(f"{argv[0]} did not answer within {timeout:g}s (is slurmctld up?)") from None
    except OSError as e:
        raise UserError(f"cannot run {argv[0]}: {e.strerror} (is this a Slurm client machine?)") from None


def load_hosts(path: "str | os.PathLike[str] | None") -> Inventory:
    """``-i PATH`` as every command reads it: an inventory file, ``slurm[:OVERLAY]`` (this allocation), or the
    embedded default (``config.inventory.load`` with the allocation reader passed in)."""
    return inventory.load(path, allocation=load_inventory)


# --------------------------------------------------------------------------------------------- pure parsers

def parse_node_records(text: str) -> dict[str, dict[str, str]]:
    """``scontrol -o show node`` output -> {NodeName: {key: value}} (one line per node, ``key=value`` words;
    values never hold spaces in one-line mode except OS=, Reason= which are kept up to the next key)."""
    out: dict[str, dict[str, str]] = {}
    for line in text.splitlines():
        fields: dict[str, list[str]] = {}     # words joined once at the end (+= per word was quadratic)
        key = None
        for word in line.split(" "):
            m = _KEY.match(word)
            if m:
                key = m.group(1)
                fields[key] = [word[m.end():]]
            elif key is not None and word:
                fields[key].append(word)
        if "NodeName" in fields:
            out[" ".join(fields["NodeName"])] = {k: " ".join(v) for k, v in fields.items()}
    return out


_KEY = re.compile(r"([A-Za-z][A-Za-z0-9_]*)=")


def gres_gpus(gres: str | None) -> int | None:
    """``Gres=gpu:4``, ``gpu:a100:8(S:0-1)``, ``gpu:2,shard:8`` -> the GPU count; None without gpu gres."""
    if not gres or gres == "(null)":
        return None
    total, seen = 0, False
    for item in gres.split(","):
        parts = _without_parens(item).split(":")
        if parts[0] != "gpu":
            continue
        seen = True
        if parts[-1].isdigit():
            total += int(parts[-1])
        else:
            total += 1
    return total if seen else None


def _without_parens(text: str) -> str:
    """``text`` without its ``(...)`` parts, as ``re.sub(r"\\(.*?\\)", "", text)`` but linear (that regex
    rescans the rest of the text from every unclosed ``(``: quadratic)."""
    kept, pos = [], 0
    while (i := text.find("(", pos)) >= 0 and (j := text.find(")", i)) >= 0:
        kept.append(text[pos:i])
        pos = j + 1
    kept.append(text[pos:])
    return "".join(kept)


def gpus_on_node(env: Mapping[str, str]) -> int | None:
    v = env.get("SLURM_GPUS_ON_NODE", "")
    return int(v) if v.isdigit() else None


def state_flags(state: str) -> set[str]:
    """``IDLE+DRAIN`` / ``MIXED+DRAIN+NOT_RESPONDING`` / ``DOWN*`` -> {"IDLE", "DRAIN"}, ... (``*``: no answer)."""
    flags = {f for f in state.rstrip("*~#!%$@^-").split("+") if f}
    if state.endswith("*"):
        flags.add("NOT_RESPONDING")
    return flags


def drained(records: Mapping[str, Mapping[str, str]]) -> set[str]:
    """Nodes Slurm will not use: drained/draining, down, failing, or not responding."""
    bad = {"DRAIN", "DRAINED", "DRAINING", "DOWN", "FAIL", "FAILING", "NOT_RESPONDING", "MAINT"}
    return {n for n, f in records.items() if state_flags(f.get("State", "")) & bad}


def drain_argv(node: str, reason: str) -> list[str]:
    """``scontrol update`` to drain ``node``: Slurm schedules nothing new on it until an admin resumes it."""
    reason = " ".join(reason.split())[:200] or "clusterctl"
    return ["scontrol", "update", f"NodeName={node}", "State=DRAIN", f"Reason=clusterctl: {reason}"]


def resume_argv(node: str) -> list[str]:
    return ["scontrol", "update", f"NodeName={node}", "State=RESUME"]


# ------------------------------------------------------------------------------------------ with scontrol

def hostnames(nodelist: str, run: RunCmd = run_cmd) -> list[str]:
    r = run(["scontrol", "show", "hostnames", nodelist], SCONTROL_TIMEOUT_S)
    if r.returncode != 0:
        raise UserError(f"scontrol show hostnames {nodelist}: {r.stderr.strip() or 'failed'}")
    return r.stdout.split()


def node_records(names: Sequence[str], run: RunCmd = run_cmd) -> dict[str, dict[str, str]]:
    r = run(["scontrol", "-o", "show", "node", ",".join(names)], SCONTROL_TIMEOUT_S)
    if r.returncode != 0:
        raise UserError(f"scontrol show node: {r.stderr.strip() or 'failed'}")
    return parse_node_records(r.stdout)


def under_slurm(hosts: Iterable[Any]) -> bool:
    """Does a job on ``hosts`` (``inventory.Host``) run under Slurm (an srun connection, or inside an allocation)?"""
    return any(h.connection == "srun" for h in hosts) or bool(os.environ.get("SLURM_JOB_ID"))


def drained_among(hosts: Iterable[Any], nodes: Sequence[str]) -> set[str]:
    """Under Slurm: those of ``nodes`` that Slurm reports drained, down or not responding (relaunches skip
    them); none outside Slurm, and none when ``scontrol`` does not answer."""
    if not under_slurm(hosts):
        return set()
    try:
        return drained(node_records(list(nodes))) & set(nodes)
    except UserError:
        return set()


def drain_if_under(hosts: Iterable[Any], node: str, reason: str) -> tuple[bool, str]:
    """Drain ``node`` when the job on ``hosts`` runs under Slurm: (done, Slurm's message)."""
    if not under_slurm(hosts):
        return False, "the job does not run under Slurm"
    try:
        return drain(node, reason)
    except UserError as e:
        return False, str(e)


def drain(node: str, reason: str, run: RunCmd = run_cmd) -> tuple[bool, str]:
    """Drain ``node``; (done, scontrol's message). Not allowed (not an operator) is a value, not an error."""
    r = run(drain_argv(node, reason), SCONTROL_TIMEOUT_S)
    return r.returncode == 0, (r.stderr or r.stdout).strip()


# ------------------------------------------------------------------------------------------------ inventory

def overlay_path(source: str, env: Mapping[str, str]) -> str | None:
    _, _, path = source.partition(":")
    return path or env.get(OVERLAY_ENV) or None


def _ld(values: Mapping[str, Any], like: Any = None):
    """A ``LineDict`` holding ``values`` with the lines of ``like`` (a loaded mapping) where it has them."""
    from clusterctl.config.yamlfile import LineDict

    d = LineDict(values)
    d.lines = dict(getattr(like, "lines", {}) or {})
    d.line = getattr(like, "line", 0) or 0
    return d


def load_inventory(source: str = SLURM_SOURCE, env: Mapping[str, str] | None = None, run: RunCmd = run_cmd):
    """The allocation as an ``Inventory`` (see the module doc): ``load_hosts`` reads ``-i slurm`` with it."""
    env = os.environ if env is None else env
    nodelist = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")
    if not nodelist:
        raise UserError("-i slurm: SLURM_JOB_NODELIST is not set: run inside an allocation (salloc, sbatch), "
                        "or use an inventory YAML")
    names = hostnames(nodelist, run)
    if not names:
        raise UserError(f"-i slurm: the allocation's node list {nodelist!r} names no hosts")
    records = node_records(names, run)
    env_gpus = gpus_on_node(env)
    overlay = overlay_path(source, env)
    data: Any = load_yaml_with_lines(overlay) if overlay else None
    file = overlay or f"<slurm allocation {env.get('SLURM_JOB_ID', '?')}>"
    if data is None:
        data = _ld({})
    if not isinstance(data, dict) or not isinstance(data.get("all") or {}, dict):
        raise InputError(file, line_of(data) or 1, "a -i slurm overlay is an inventory mapping: all: {vars: ...}")
    top = data.get("all") or _ld({})
    data["all"] = top
    given = top.get("hosts") or {}
    if not isinstance(given, dict):
        raise InputError(file, line_of(top, "hosts"), "all.hosts: expected a mapping of host name -> vars")
    for name in given:
        if name not in names:
            raise InputError(file, line_of(given, name), f"host {name!r} is not in the allocation "
                                                         f"({', '.join(names)})", key=f"all.hosts.{name}")
    group_vars = top.get("vars") or {}
    hosts: dict[str, Any] = {}
    for n in names:
        own = given.get(n) or {}
        rec = records.get(n, {})
        found: dict[str, Any] = {}
        addr = rec.get("NodeAddr")
        if addr and addr != n and "ansible_host" not in own:
            found["ansible_host"] = addr
        gpus = env_gpus if env_gpus is not None else gres_gpus(rec.get("Gres"))
        if gpus is not None and "clusterctl_gpus" not in own and "clusterctl_gpus" not in group_vars:
            found["clusterctl_gpus"] = gpus
        hosts[n] = _ld({**found, **own}, own)
    top["hosts"] = _ld(hosts, given)
    top["vars"] = _ld({"clusterctl_connection": "srun", **group_vars}, group_vars)
    inv = inventory.parse_data(data, file)
    # allocation order, not the overlay's: the first allocated node is the rendezvous host
    order = {n: i for i, n in enumerate(names)}
    return inventory.Inventory(source=f"slurm job {env.get('SLURM_JOB_ID', '?')}" + (f" + {overlay}" if overlay else ""),
                             hosts=tuple(sorted(inv.hosts, key=lambda h: order[h.name])), groups=inv.groups,
                             allocation=True)
