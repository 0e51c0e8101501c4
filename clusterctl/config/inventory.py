"""Ansible-shaped YAML inventory -> frozen ``Host`` values, vars merged once.

Precedence (lowest first): ``all`` vars, parent-group vars, child-group vars, host vars.
Errors are ``InputError`` with the YAML line of the offending key.
"""
from __future__ import annotations

import difflib
import ipaddress
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

from clusterctl.config.yamlfile import MAX_VALUE_ITEMS, expanded_items, line_of, load_yaml_with_lines
from clusterctl.errors import InputError, UserError

CONNECTIONS = ("ssh", "local", "srun")
RUNTIMES = ("docker", "podman", "bare")

# clusterctl_infiniband's values -> Host.infiniband (None: auto, decided on the node at the job's first start)
INFINIBAND: dict[Any, bool | None] = {"auto": None, True: True, False: False}

# var name -> (python type(s), description). Unknown ansible_*/clusterctl_* keys are errors.
KNOWN_VARS: dict[str, tuple[tuple[type, ...], str]] = {
    "ansible_host": ((str,), "address to connect to (default: the host's name)"),
    "ansible_port": ((int,), "SSH port (default 22 or ~/.ssh/config)"),
    "ansible_user": ((str,), "SSH user (default ~/.ssh/config or the local user)"),
    "ansible_ssh_private_key_file": ((str,), "private key file"),
    "ansible_connection": ((str,), "accepted for compatibility: 'ssh' or 'local'"),
    "clusterctl_connection": ((str,), "ssh (default) | local | srun (Slurm job steps, no SSH)"),
    "clusterctl_runtime": ((str,), "docker (default) | podman | bare"),
    "clusterctl_gpus": ((int,), "expected GPU count; 0 = CPU host"),
    "clusterctl_interface": ((str,), "NIC for NCCL/Gloo traffic (default: the NIC carrying the address)"),
    "clusterctl_infiniband": ((str, bool), "auto (default: on where /dev/infiniband/uverbs* exist) | true | false: "
                                           "containers get /dev/infiniband, IPC_LOCK and an unlimited memlock"),
    "clusterctl_known_hosts": ((str,), "extra known_hosts file for this host"),
    "clusterctl_slurm_job_id": ((str, int), "srun connection: the allocation to run steps in (default: "
                                             "$SLURM_JOB_ID)"),
    "clusterctl_proxy_jump": ((str,), "bastion(s): [user@]host[:port][,[user@]host[:port]...] (host: a name, "
                                      "an IPv4 address or [IPv6])"),
}

# Ansible vars an Ansible inventory commonly holds that clusterctl has no use for: accepted, with a note saying why
# (refusing them made an existing inventory unusable as is). Passwords stay refused (PASSWORD_VARS).
_BECOME = "clusterctl does not escalate privileges: the SSH user runs the job (give it docker/podman access)"
_OWN_SSH = ("clusterctl speaks SSH itself (paramiko): use ~/.ssh/config, ansible_ssh_private_key_file or "
            "clusterctl_proxy_jump")
IGNORED_VARS: dict[str, str] = {
    "ansible_python_interpreter": "clusterctl runs no Python on the hosts but the job's own (the job's torchrun:)",
    "ansible_become": _BECOME, "ansible_become_user": _BECOME, "ansible_become_method": _BECOME,
    "ansible_become_flags": _BECOME, "ansible_become_exe": _BECOME,
    "ansible_ssh_common_args": _OWN_SSH, "ansible_ssh_extra_args": _OWN_SSH, "ansible_ssh_args": _OWN_SSH,
    "ansible_ssh_pipelining": _OWN_SSH, "ansible_pipelining": _OWN_SSH, "ansible_ssh_executable": _OWN_SSH,
    "ansible_timeout": "clusterctl's connect timeout is its own (5 s)",
    "ansible_shell_type": "clusterctl runs POSIX sh on the hosts", "ansible_shell_executable":
    "clusterctl runs POSIX sh on the hosts",
}


@dataclass(frozen=True)
class Note:
    """An inventory var clusterctl accepted but does not use (``IGNORED_VARS``), at its first line."""
    file: str
    line: int | None
    var: str
    why: str

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}" if self.line else self.file
        return f"{where}: {self.var}: accepted but not used ({self.why})"

    def to_dict(self) -> dict[str, Any]:
        return {"file": self.file, "line": self.line, "var": self.var, "why": self.why}


HOSTNAME_RE = re.compile(r"^[A-Za-z0-9_]([A-Za-z0-9_.-]{0,252})$")
# ansible_host and proxy-jump hosts: a DNS name (labels of letters, digits, '_' and '-', not starting with '-')
# or an IP literal. Never a known_hosts pattern (`*`, `?`, `!`, `,`) or shell text: the name is written into
# known_hosts and shown in suggested commands.
DNS_NAME_RE = re.compile(r"^(?=.{1,253}$)[A-Za-z0-9_][A-Za-z0-9_-]{0,62}(\.[A-Za-z0-9_][A-Za-z0-9_-]{0,62})*\.?$")
ZONE_RE = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
JUMP_USER_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}$")
MAX_JUMPS = 4
DASH_RANGE_RE = re.compile(r"\[([0-9]+|[a-z])-([0-9]+|[a-z])\]")   # gpu[01-04]: a common slip for gpu[01:04]
RANGE_RE = re.compile(r"\[([0-9]+|[a-z]):([0-9]+|[a-z])(?::([0-9]+))?\]")


def is_address(value: str) -> bool:
    """A host name or an IP literal (IPv6 without brackets, an optional ``%zone`` of safe characters)."""
    if DNS_NAME_RE.match(value):
        return True
    ip, _, zone = value.partition("%")
    try:
        ipaddress.ip_address(ip)
    except ValueError:
        return False
    return not zone or (":" in ip and bool(ZONE_RE.match(zone)))


@dataclass(frozen=True)
class Jump:
    user: str | None
    host: str
    port: int | None

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return (f"{self.user}@" if self.user else "") + host + (f":{self.port}" if self.port else "")


def parse_proxy_jump(value: str) -> list[Jump]:
    """``[user@]host[:port]``, comma-separated for several hops (the first is connected to first, as OpenSSH's
    ProxyJump). ``host``: a name, an IPv4 address or ``[IPv6]``. ``ValueError`` with the reason otherwise."""
    hops = value.split(",")
    if len(hops) > MAX_JUMPS:
        raise ValueError(f"at most {MAX_JUMPS} jump hosts, got {len(hops)}")
    out = []
    for hop in hops:
        if "://" in hop:
            raise ValueError(f"jump host {hop!r}: use [user@]host[:port], not a URI")
        user, at, hostport = hop.rpartition("@")
        if at and not JUMP_USER_RE.match(user):
            raise ValueError(f"jump host {hop!r}: invalid user {user!r}")
        if hostport.startswith("["):
            host, sep, rest = hostport[1:].partition("]")
            if not sep or (rest and not rest.startswith(":")) or ":" not in host:
                raise ValueError(f"jump host {hop!r}: expected [IPv6 address] or [IPv6 address]:port")
            port = rest[1:] if rest else None
        elif hostport.count(":") > 1:
            raise ValueError(f"jump host {hop!r}: write an IPv6 address in brackets, [address]:port")
        else:
            host, sep, port = hostport.partition(":")
            if sep and not port:
                raise ValueError(f"jump host {hop!r}: empty port")
            port = port or None
        if not host or not is_address(host):
            raise ValueError(f"jump host {hop!r}: {host!r} is not a host name or IP address")
        if port is not None and (not port.isdigit() or not 1 <= int(port) <= 65535):
            raise ValueError(f"jump host {hop!r}: port {port!r} is not a number in 1..65535")
        out.append(Jump(user or None, host, int(port) if port else None))
    return out


@dataclass(frozen=True)
class Host:
    name: str
    address: str
    port: int | None = None
    user: str | None = None
    key_file: str | None = None
    connection: str = "ssh"
    runtime: str = "docker"
    gpus: int | None = None
    interface: str | None = None
    infiniband: bool | None = None       # clusterctl_infiniband: None = auto (on where /dev/infiniband/uverbs*)
    known_hosts: str | None = None
    proxy_jump: str | None = None
    groups: tuple[str, ...] = ()
    vars: Mapping[str, Any] = field(default_factory=dict, compare=False, hash=False)
    # var name -> (file, line) where its effective value was set; for errors found after loading
    origin: Mapping[str, tuple[str, int | None]] = field(default_factory=dict, compare=False, hash=False)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name, "address": self.address, "port": self.port, "user": self.user,
            "key_file": self.key_file, "connection": self.connection, "runtime": self.runtime,
            "gpus": self.gpus, "interface": self.interface, "known_hosts": self.known_hosts,
            "proxy_jump": self.proxy_jump, "groups": list(self.groups), "vars": dict(self.vars),
        }


@dataclass(frozen=True)
class Inventory:
    source: str                       # file path or "<embedded default>"
    hosts: tuple[Host, ...]
    groups: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # group -> host names
    # the hosts are a scheduler's allocation (-i slurm): every one is the job's, those beyond nodes' MAX its spares
    # (from a file, only a job's `hosts:` does that: an inventory of 100 hosts is not a job's 3 and 97 spares)
    allocation: bool = False
    notes: tuple[Note, ...] = ()      # Ansible vars accepted but not used (IGNORED_VARS), once per var

    def get(self, name: str) -> Host:
        for h in self.hosts:
            if h.name == name:
                return h
        raise KeyError(name)

    def select(self, patterns: Iterable[str]) -> list[Host]:
        """Hosts named by host or group names, in the given order, without duplicates."""
        out: list[Host] = []
        for p in patterns:
            names = self.groups.get(p) or ((p,) if any(h.name == p for h in self.hosts) else ())
            if not names:
                raise UserError(f"{self.source}: no host or group named {p!r}")
            for n in names:
                h = self.get(n)
                if h not in out:
                    out.append(h)
        return out


EMBEDDED_DEFAULT = "<embedded default>"


def default_inventory() -> Inventory:
    host = Host(name="localhost", address="127.0.0.1", connection="local", runtime="bare", gpus=0,
                groups=("all",), vars={"clusterctl_connection": "local", "clusterctl_runtime": "bare"})
    return Inventory(source=EMBEDDED_DEFAULT, hosts=(host,), groups={"all": ("localhost",)})


def resolve_path(path: str | None) -> str | None:
    """-i, then $CLUSTERCTL_INVENTORY, then ./inventory.yaml; None means the embedded default."""
    if path:
        return path
    env = os.environ.get("CLUSTERCTL_INVENTORY")
    if env:
        return env
    if Path("inventory.yaml").exists():
        return "inventory.yaml"
    return None


SLURM_SOURCE = "slurm"


def is_slurm_source(path: "str | os.PathLike[str] | None") -> bool:
    """``slurm`` or ``slurm:OVERLAY`` (a str as -i gives it; a Path is always a file)."""
    return isinstance(path, str) and (path == SLURM_SOURCE or path.startswith(SLURM_SOURCE + ":"))


def load(path: "str | os.PathLike[str] | None",
         allocation: Callable[[str], Inventory] | None = None) -> Inventory:
    """The inventory ``-i`` names (see ``resolve_path``). ``-i slurm[:OVERLAY]`` is the allocation this process
    runs in, read by ``allocation`` (``clusterctl.slurm.allocation.load_inventory``, passed in by the commands:
    config/ runs no command)."""
    resolved = resolve_path(path)
    if resolved is None:
        return default_inventory()
    if is_slurm_source(resolved):
        if allocation is None:
            raise UserError(f"-i {resolved}: this command cannot read a Slurm allocation")
        return allocation(resolved)
    return parse(resolved)


# ---------------------------------------------------------------- parsing

GROUP_KEYS = ("hosts", "children", "vars")
MAX_GPUS_PER_HOST = 64      # far above any machine built (8-16), far below a typo (an extra zero or three)
PASSWORD_VARS = ("ansible_password", "ansible_ssh_pass", "ansible_ssh_password", "ansible_become_password",
                 "ansible_become_pass")


def expand_range(pattern: str) -> list[str]:
    """``gpu[01:16]`` -> gpu01..gpu16 (width kept); ``n[a:c]`` -> na, nb, nc; ``[0:10:2]`` strides.
    At most ``MAX_HOST_ENTRIES`` names (``n[0:9999][0:9999]`` is refused before it is built). Iterative: a pattern
    with a thousand ranges is a cross product, never a recursion."""
    pieces: list[list[str]] = []
    pos, total = 0, 1
    for m in RANGE_RE.finditer(pattern):
        lo, hi, step = m.group(1), m.group(2), int(m.group(3) or 1)
        if lo.isdigit() != hi.isdigit():
            raise ValueError(f"bad range [{lo}:{hi}]")
        if step < 1:
            raise ValueError(f"bad range [{m.group(0)[1:-1]}]: the step must be at least 1")
        first, last = (int(lo), int(hi)) if lo.isdigit() else (ord(lo), ord(hi))
        count = max(0, (last - first) // step + 1)
        if not count:
            raise ValueError(f"empty range [{lo}:{hi}]")
        total *= count
        if total > MAX_HOST_ENTRIES:
            raise ValueError(f"expands to more than {MAX_HOST_ENTRIES} hosts")
        if lo.isdigit():
            width = len(lo) if lo.startswith("0") and len(lo) > 1 else 0
            items = [str(i).zfill(width) for i in range(first, last + 1, step)]
        else:
            items = [chr(c) for c in range(first, last + 1, step)]
        pieces += [[pattern[pos:m.start()]], items]
        pos = m.end()
    names = [""]
    for choices in [*pieces, [pattern[pos:]]]:
        names = [n + c for n in names for c in choices]
    return names


# YAML aliases let a few hundred bytes name a group DAG with 2^18 paths; the walk below visits a group once per
# path (its ancestors differ), so the visits are capped: far above any real inventory, far below a slow load.
MAX_GROUP_VISITS = 10_000
MAX_HOST_ENTRIES = 500_000


class _Parser:
    def __init__(self, file: str):
        self.file = file
        self.visits = 0
        self.host_entries = 0
        self.group_vars: dict[str, tuple[int, dict, dict]] = {}   # group -> (depth, vars, lines)
        self.host_vars: dict[str, list[tuple[dict, dict]]] = {}   # host -> [(vars, lines)] in order
        self.host_lines: dict[str, int | None] = {}
        self.membership: dict[str, set[str]] = {}                 # host -> groups (incl. ancestors)
        self.groups: dict[str, dict[str, None]] = {}              # group -> hosts in order (a dict: O(1) "in")
        self.notes: dict[str, Note] = {}                          # var -> its note (IGNORED_VARS), first line

    def err(self, node, key, message, dotted=None):
        raise InputError(self.file, line_of(node, key), message, key=dotted)

    def group(self, name: str, node: Any, ancestors: tuple[str, ...], parent: Any, key_in_parent: Any) -> None:
        if name in ancestors:
            self.err(parent, key_in_parent, f"group {name!r} contains itself")
        self.visits += 1
        if self.visits > MAX_GROUP_VISITS:
            self.err(parent, key_in_parent, f"the groups expand to more than {MAX_GROUP_VISITS} group entries "
                                            f"(YAML aliases repeating groups?)")
        if node is None:
            node = {}
        if not isinstance(node, dict):
            self.err(parent, key_in_parent, f"group {name!r} must be a mapping with hosts/children/vars")
        for k in node:
            if k not in GROUP_KEYS:
                if not ancestors[1:] and (str(k).startswith(("ansible_", "clusterctl_")) or name == "hosts"):
                    self.err(node, k, f"unknown key {k!r} in group {name!r}: a flat inventory? hosts go under "
                                      "`all: hosts:`, e.g. all: {hosts: {node1: {ansible_host: 10.0.0.1}}}")
                hint = difflib.get_close_matches(str(k), GROUP_KEYS, 1)
                self.err(node, k, f"unknown key {k!r} in group {name!r}" + (f" (did you mean {hint[0]!r}?)" if hint else ""))
        chain = ancestors + (name,)
        depth = len(ancestors)
        gvars = node.get("vars") or {}
        if not isinstance(gvars, dict):
            self.err(node, "vars", "vars must be a mapping", dotted=f"{name}.vars")
        self.check_vars(gvars)
        prev = self.group_vars.get(name)
        if prev is None or prev[0] < depth:
            merged = dict(prev[1]) if prev else {}
            merged.update(gvars)
            lines = dict(prev[2]) if prev else {}
            lines.update({k: line_of(gvars, k) for k in gvars})
            self.group_vars[name] = (depth, merged, lines)
        else:
            prev[1].update(gvars)
            prev[2].update({k: line_of(gvars, k) for k in gvars})
        self.groups.setdefault(name, {})
        hosts = node.get("hosts") or {}
        if not isinstance(hosts, dict):
            self.err(node, "hosts", "hosts must be a mapping of host names (to their vars or nothing)",
                     dotted=f"{name}.hosts")
        seen_here: set[str] = set()
        for pattern, hvars in hosts.items():
            if not isinstance(pattern, str):
                self.err(hosts, pattern, f"host name must be a string, got {pattern!r}")
            try:
                names = expand_range(pattern)
            except ValueError as e:
                self.err(hosts, pattern, f"host {pattern!r}: {e}")
            if hvars is None:
                hvars = {}
            if not isinstance(hvars, dict):
                self.err(hosts, pattern, f"host {pattern!r}: vars must be a mapping")
            self.check_vars(hvars)
            self.host_entries += len(names)
            if self.host_entries > MAX_HOST_ENTRIES:
                self.err(hosts, pattern, f"the groups list more than {MAX_HOST_ENTRIES} host entries (YAML aliases "
                                         f"repeating groups?)")
            for hn in names:
                if not HOSTNAME_RE.match(hn):
                    dashed = DASH_RANGE_RE.search(hn)
                    hint = "; ranges use ':', e.g. " + DASH_RANGE_RE.sub(r"[\1:\2]", hn) if dashed else ""
                    self.err(hosts, pattern, f"invalid host name {hn!r} (letters, digits, '.', '-', '_'){hint}")
                if hn in seen_here:
                    self.err(hosts, pattern, f"duplicate host {hn!r} in group {name!r}")
                seen_here.add(hn)
                self.host_vars.setdefault(hn, []).append((hvars, {k: line_of(hvars, k) for k in hvars}))
                self.host_lines.setdefault(hn, line_of(hosts, pattern))
                self.membership.setdefault(hn, set()).update(chain)
                for g in chain:
                    self.groups.setdefault(g, {})[hn] = None
        children = node.get("children") or {}
        if not isinstance(children, dict):
            self.err(node, "children", "children must be a mapping of group names", dotted=f"{name}.children")
        for child, cnode in children.items():
            if not isinstance(child, str) or not HOSTNAME_RE.match(child):
                self.err(children, child, f"invalid group name {child!r}")
            self.group(child, cnode, chain, children, child)

    def check_vars(self, vars_: dict) -> None:
        for k, v in vars_.items():
            if not isinstance(k, str):
                self.err(vars_, k, f"variable name must be a string, got {k!r}")
            if isinstance(v, (dict, list)) and expanded_items(v) > MAX_VALUE_ITEMS:
                self.err(vars_, k, f"YAML aliases expand this value to more than {MAX_VALUE_ITEMS} items (an alias "
                                   "repeated inside aliases?): write the value out, or keep it smaller", dotted=k)
            if k in IGNORED_VARS:
                self.notes.setdefault(k, Note(self.file, line_of(vars_, k), k, IGNORED_VARS[k]))
                continue
            if k.startswith(("ansible_", "clusterctl_")):
                if k in PASSWORD_VARS:
                    self.err(vars_, k, "passwords are not supported: use an SSH key "
                                       "(ansible_ssh_private_key_file) or an ssh-agent (SSH_AUTH_SOCK)", dotted=k)
                if k not in KNOWN_VARS:
                    hint = difflib.get_close_matches(k, [*KNOWN_VARS, *IGNORED_VARS], 1)
                    self.err(vars_, k, "unknown variable" + (f" (did you mean {hint[0]!r}?)" if hint else ""), dotted=k)
                types, _ = KNOWN_VARS[k]
                if (isinstance(v, bool) and bool not in types) or not isinstance(v, types):
                    want = " or ".join(t.__name__ for t in types).replace("str", "string").replace("int", "integer")
                    self.err(vars_, k, f"must be {want}, got {type(v).__name__} {v!r}", dotted=k)
                self.check_value(vars_, k, v)

    def check_value(self, vars_: dict, k: str, v: Any) -> None:
        if isinstance(v, str) and ("\x00" in v or "\n" in v):
            self.err(vars_, k, "must be a single line", dotted=k)
        if k == "ansible_port" and not 1 <= v <= 65535:
            self.err(vars_, k, f"port out of range 1..65535: {v}", dotted=k)
        if k == "clusterctl_gpus" and not 0 <= v <= MAX_GPUS_PER_HOST:
            self.err(vars_, k, f"must be a GPU count 0..{MAX_GPUS_PER_HOST}, got {v}", dotted=k)
        if k in ("clusterctl_connection", "ansible_connection") and v not in CONNECTIONS:
            self.err(vars_, k, f"must be one of {', '.join(CONNECTIONS)}, got {v!r}", dotted=k)
        if k == "clusterctl_infiniband" and v not in INFINIBAND:
            self.err(vars_, k, f"must be auto, true or false, got {v!r}", dotted=k)
        if k == "clusterctl_slurm_job_id" and not str(v).isdigit():
            self.err(vars_, k, f"must be a Slurm job id (digits), got {v!r}", dotted=k)
        if k == "clusterctl_runtime" and v not in RUNTIMES:
            self.err(vars_, k, f"must be one of {', '.join(RUNTIMES)}, got {v!r}", dotted=k)
        if k in ("ansible_host", "ansible_user", "clusterctl_interface", "clusterctl_proxy_jump"):
            if not v or v.startswith("-") or any(c.isspace() for c in v):
                self.err(vars_, k, f"invalid value {v!r} (empty, leading '-' or whitespace)", dotted=k)
        if k == "ansible_host" and not is_address(v):
            self.err(vars_, k, f"invalid value {v!r}: must be a host name (letters, digits, '-', '_', '.') or an "
                               f"IP address", dotted=k)
        if k == "clusterctl_proxy_jump":
            try:
                parse_proxy_jump(v)
            except ValueError as e:
                self.err(vars_, k, f"invalid value {v!r}: {e}", dotted=k)

    def path_from_here(self, path: str | None) -> str | None:
        """A relative path in the inventory (``clusterctl_known_hosts``) is relative to the inventory file's
        directory, not to wherever clusterctl runs (issue 24); ``~`` is expanded where the file is read."""
        if not path or path.startswith("~") or os.path.isabs(path) or self.file.startswith("<"):
            return path
        return os.path.join(os.path.dirname(os.path.abspath(self.file)), path)

    def resolve(self) -> Inventory:
        hosts = []
        for hn, defs in self.host_vars.items():
            merged: dict[str, Any] = {}
            origin: dict[str, tuple[str, int | None]] = {}
            groups = sorted(self.membership[hn], key=lambda g: (self.group_vars[g][0], g))
            for g in groups:
                _, gv, gl = self.group_vars[g]
                merged.update(gv)
                origin.update({k: (self.file, gl.get(k)) for k in gv})
            for hv, hl in defs:
                merged.update(hv)
                origin.update({k: (self.file, hl.get(k)) for k in hv})
            connection = merged.get("clusterctl_connection", merged.get("ansible_connection", "ssh"))
            hosts.append(Host(
                name=hn,
                address=merged.get("ansible_host", hn),
                port=merged.get("ansible_port"),
                user=merged.get("ansible_user"),
                key_file=merged.get("ansible_ssh_private_key_file"),
                connection=connection,
                runtime=merged.get("clusterctl_runtime", "docker"),
                gpus=merged.get("clusterctl_gpus"),
                interface=merged.get("clusterctl_interface"),
                infiniband=INFINIBAND[merged.get("clusterctl_infiniband", "auto")],
                known_hosts=self.path_from_here(merged.get("clusterctl_known_hosts")),
                proxy_jump=merged.get("clusterctl_proxy_jump"),
                groups=tuple(g for g in groups),
                vars=merged,
                origin=origin,
            ))
        for g in self.groups:
            if g in self.host_vars:
                raise InputError(self.file, self.host_lines.get(g), f"name {g!r} is both a host and a group")
        return Inventory(source=self.file, hosts=tuple(hosts),
                         groups={g: tuple(v) for g, v in self.groups.items()},
                         notes=tuple(sorted(self.notes.values(), key=lambda n: (n.line or 0, n.var))))


def parse(path: str) -> Inventory:
    data = load_yaml_with_lines(path)
    return parse_data(data, path)


def parse_data(data: Any, file: str) -> Inventory:
    if data is None:
        raise InputError(file, None, "inventory is empty: expected 'all:' with hosts")
    if not isinstance(data, dict):
        raise InputError(file, line_of(data) or 1, "inventory must be a mapping with an 'all' group; hosts go "
                                                   "under `all: hosts:`, e.g. all: {hosts: {node1: {ansible_host: "
                                                   "10.0.0.1}}}")
    if "all" not in data and ({"name", "script", "module", "nodes"} & set(data)):
        raise InputError(file, None, "this looks like a job file (it has `name:`/`script:`), not an inventory: "
                                     "`clusterctl launch JOB.yaml -i INVENTORY.yaml` (the job first, the inventory "
                                     "after -i)")
    p = _Parser(file)
    top = data.get("all")
    if "all" in data:
        p.group("all", top, (), data, "all")
    else:
        p.group_vars["all"] = (0, {}, {})
    for name, node in data.items():
        if name == "all":
            continue
        if not isinstance(name, str) or not HOSTNAME_RE.match(name):
            raise InputError(file, line_of(data, name), f"invalid group name {name!r}")
        p.group(name, node, ("all",), data, name)
    inv = p.resolve()
    if not inv.hosts:
        raise InputError(file, line_of(data) or 1, "inventory defines no hosts")
    return inv
