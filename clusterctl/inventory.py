"""Ansible-shaped YAML inventory -> frozen ``Host`` values, vars merged once.

Precedence (lowest first): ``all`` vars, parent-group vars, child-group vars, host vars.
Errors are ``InputError`` with the YAML line of the offending key.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping

import yaml

from clusterctl.errors import InputError, UserError
from clusterctl.yamlfile import load_yaml_with_lines, line_of

CONNECTIONS = ("ssh", "local")
RUNTIMES = ("docker", "podman", "bare")

# var name -> (python type(s), description). Unknown ansible_*/clusterctl_* keys are errors.
KNOWN_VARS: dict[str, tuple[tuple[type, ...], str]] = {
    "ansible_host": ((str,), "address to connect to (default: the host's name)"),
    "ansible_port": ((int,), "SSH port (default 22 or ~/.ssh/config)"),
    "ansible_user": ((str,), "SSH user (default ~/.ssh/config or the local user)"),
    "ansible_ssh_private_key_file": ((str,), "private key file"),
    "ansible_connection": ((str,), "accepted for compatibility: 'ssh' or 'local'"),
    "clusterctl_connection": ((str,), "ssh (default) | local"),
    "clusterctl_runtime": ((str,), "docker (default) | podman | bare"),
    "clusterctl_gpus": ((int,), "expected GPU count; 0 = CPU host"),
    "clusterctl_interface": ((str,), "NIC for NCCL/Gloo traffic (default: the NIC carrying the address)"),
    "clusterctl_known_hosts": ((str,), "extra known_hosts file for this host"),
    "clusterctl_proxy_jump": ((str,), "bastion, [user@]host[:port]"),
}

HOSTNAME_RE = re.compile(r"^[A-Za-z0-9_]([A-Za-z0-9_.-]{0,252})$")
RANGE_RE = re.compile(r"\[([0-9]+|[a-z]):([0-9]+|[a-z])(?::([0-9]+))?\]")


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
    known_hosts: str | None = None
    proxy_jump: str | None = None
    groups: tuple[str, ...] = ()
    vars: Mapping[str, Any] = field(default_factory=dict, compare=False, hash=False)

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


def load(path: str | None) -> Inventory:
    resolved = resolve_path(path)
    if resolved is None:
        return default_inventory()
    return parse(resolved)
