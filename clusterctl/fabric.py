"""fabric for the on-call engineer's own scripts, with clusterctl's inventory and host-key policy.

    from clusterctl.fabric import group
    g = group("inventory.yaml", limit="gpu*")          # or group(job="llama-7b"): the job's current nodes
    for conn, result in g.run("nvidia-smi -L", hide=True, warn=True).items():
        print(conn.original_host, result.stdout)

fabric's own ``Connection`` accepts any host key (paramiko ``AutoAddPolicy``). These Connections refuse an unknown
or changed key exactly as clusterctl does: the key must be in ``~/.ssh/known_hosts`` or the host's
``clusterctl_known_hosts`` (``accept_new_host_keys=True`` records an unknown one, like OpenSSH ``accept-new``; a
changed one is always refused). Address, port, user, key and ProxyJump (as a fabric ``gateway``) come from the
inventory, then ``~/.ssh/config``, as for clusterctl's own transport. Needs the extra: ``pip install
'clusterctl[fabric]'``. Never pass user values through fabric's ``env=`` (fabric issue #2364: not quoted); quote
them into the command with ``shlex.join``.
"""
from __future__ import annotations

import os
from typing import TYPE_CHECKING, Sequence

import paramiko

from clusterctl.errors import HostKeyError, UserError
from clusterctl.transport.ssh import check_host_key, known_hosts_files, known_keys, resolve_target

if TYPE_CHECKING:
    import fabric as fabric_pkg

    from clusterctl.config.inventory import Host, Inventory


class RefusedHostKey(HostKeyError, paramiko.SSHException):
    """An unknown or changed host key (a ``paramiko.SSHException`` too, so fabric and paramiko code catch it)."""


class HostKeyPolicy(paramiko.MissingHostKeyPolicy):
    """clusterctl's check (``transport.ssh.check_host_key``) as a paramiko policy. The fabric client holds no
    keys of its own, so paramiko asks this policy about every key a server offers."""

    def __init__(self, host_name: str, known_files: Sequence[str], record_file: str, accept_new: bool = False):
        self.host_name, self.known_files = host_name, list(known_files)
        self.record_file, self.accept_new = record_file, accept_new

    def missing_host_key(self, client, hostname: str, key: paramiko.PKey) -> None:
        try:
            check_host_key(self.host_name, hostname, key, known_keys(self.known_files, hostname), self.known_files,
                           self.record_file, self.accept_new)
        except HostKeyError as e:
            raise RefusedHostKey(e.host, e.message.replace("rerun with --accept-new-host-keys",
                                                           "pass accept_new_host_keys=True")) from None


def _fabric():
    try:
        import fabric
    except ImportError:
        raise UserError("clusterctl.fabric needs fabric: pip install 'clusterctl[fabric]'") from None
    return fabric


def connection(host: "Host", *, known_hosts: str | None = None, ssh_config: str | None = None,
               accept_new_host_keys: bool = False, connect_timeout: float = 10, _depth: int = 0
               ) -> "fabric_pkg.Connection":
    """A fabric ``Connection`` to one inventory host with clusterctl's host-key policy (and its ProxyJump)."""
    fabric = _fabric()
    from clusterctl.config.inventory import Host

    target = resolve_target(host, ssh_config)
    files, record = known_hosts_files(host, target, known_hosts)
    gateway = False
    if target.proxy_jump:
        if _depth > 3:
            raise UserError(f"{host.name}: ProxyJump chain too long")
        user, _, hostport = target.proxy_jump.split(",")[0].rpartition("@")
        hname, _, port = hostport.partition(":")
        jump = Host(name=f"{host.name} via {hname}", address=hname, port=int(port) if port else None,
                    user=user or None, known_hosts=host.known_hosts)
        gateway = connection(jump, known_hosts=known_hosts, ssh_config=ssh_config,
                             accept_new_host_keys=accept_new_host_keys, connect_timeout=connect_timeout,
                             _depth=_depth + 1)
    kwargs: dict = {"banner_timeout": connect_timeout, "auth_timeout": connect_timeout}
    if target.key_files:
        kwargs["key_filename"] = [os.path.expanduser(k) for k in target.key_files]
    conn = fabric.Connection(host=target.hostname, user=target.user, port=target.port, gateway=gateway,
                             connect_timeout=max(1, int(connect_timeout)), connect_kwargs=kwargs)
    conn.client.set_missing_host_key_policy(
        HostKeyPolicy(host.name, files, record, accept_new_host_keys))
    conn.clusterctl_host = host          # the inventory host behind this connection
    return conn


def group(inventory: "str | Inventory | None" = None, *, limit: str | None = None, job: str | None = None,
          state_dir: str | None = None, known_hosts: str | None = None, ssh_config: str | None = None,
          accept_new_host_keys: bool = False, connect_timeout: float = 10) -> "fabric_pkg.ThreadingGroup":
    """A fabric ``ThreadingGroup`` over the inventory's hosts (``limit``: names, groups, comma lists, globs, as
    ``clusterctl exec --limit``), or over the nodes of ``job``'s current attempt."""
    fabric = _fabric()
    from clusterctl.config import hostpattern
    from clusterctl.config import inventory as inventory_mod
    from clusterctl.slurm.allocation import load_hosts

    if job is not None:
        from clusterctl.oncall import jobnodes
        from clusterctl.store import paths
        from clusterctl.store.state import Store

        store = Store(paths.db_path(paths.state_dir(state_dir)))
        jn = jobnodes.load(store, job)
        hosts = [jn.host(n) for n in jn.nodes]
        if limit:
            wanted = {h.name for h in hostpattern.select(
                inventory_mod.Inventory(source=f"job {job}", hosts=tuple(hosts),
                                        groups={"all": tuple(h.name for h in hosts)}), limit)}
            hosts = [h for h in hosts if h.name in wanted]
    else:
        inv = inventory if isinstance(inventory, inventory_mod.Inventory) else load_hosts(inventory)
        hosts = hostpattern.select(inv, limit)
    local = [h.name for h in hosts if h.connection != "ssh"]
    if local:
        raise UserError(f"clusterctl.fabric speaks SSH only; {', '.join(local)} use clusterctl_connection local")
    return fabric.ThreadingGroup.from_connections([
        connection(h, known_hosts=known_hosts, ssh_config=ssh_config, accept_new_host_keys=accept_new_host_keys,
                   connect_timeout=connect_timeout) for h in hosts])
