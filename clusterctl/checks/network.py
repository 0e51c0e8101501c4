"""Network checks: ``ss -Hltn`` and ``ip -o addr/link`` parsers (pure); ports and interface checks."""
from __future__ import annotations

import ipaddress
import re
import shlex
from typing import Any

from clusterctl.checks.model import Check, HostProbe, Probe, is_ip, section, tool_cmd, tool_error
from clusterctl.checks.results import CheckResult, failed, passed, skipped, warned
from clusterctl.checks.runtime import runtime_info
from clusterctl.config.hostport import endpoint


def parse_ss_listen(output: str, rc: int = 0) -> list[dict[str, Any]]:
    """``ss -Hltn`` -> [{"address": "0.0.0.0", "port": 29400}, ...] (IPv6 addresses without brackets)."""
    out = []
    if rc != 0:
        return out
    for line in output.splitlines():
        cols = line.split()
        if len(cols) < 5 or cols[0] != "LISTEN":
            continue
        addr, _, port = cols[3].rpartition(":")
        if not port.isdigit():
            continue
        addr = addr.strip("[]")
        out.append({"address": addr, "port": int(port)})
    return out


_ADDR_RE = re.compile(r"^(\d+):\s+(\S+)\s+(inet6?)\s+(\S+?)/(\d+)(?:\s|$)(.*)$")
_LINK_RE = re.compile(r"^(\d+):\s+([^:\s]+?)(?:@(\S+?))?:\s+<([^>]*)>(.*)$")


def parse_ip_addr(output: str, rc: int = 0) -> list[dict[str, Any]]:
    """``ip -o addr show`` -> [{"index", "name", "family", "address", "prefixlen", "scope"}]."""
    out = []
    for line in output.splitlines():
        m = _ADDR_RE.match(line.strip())
        if not m:
            continue
        scope = re.search(r"\bscope\s+(\S+)", m.group(6))
        out.append({"index": int(m.group(1)), "name": m.group(2), "family": m.group(3), "address": m.group(4),
                    "prefixlen": int(m.group(5)), "scope": scope.group(1) if scope else None})
    return out


def parse_ip_link(output: str, rc: int = 0) -> list[dict[str, Any]]:
    """``ip -o link show`` -> [{"index", "name", "flags", "state", "mtu"}] (``eth0@if5`` -> ``eth0``)."""
    out = []
    for line in output.splitlines():
        m = _LINK_RE.match(line.strip())
        if not m:
            continue
        rest = m.group(5)
        state = re.search(r"\bstate\s+(\S+)", rest)
        mtu = re.search(r"\bmtu\s+(\d+)", rest)
        out.append({"index": int(m.group(1)), "name": m.group(2), "flags": m.group(4).split(",") if m.group(4)
                    else [], "state": state.group(1) if state else None, "mtu": int(mtu.group(1)) if mtu else None})
    return out


def link_is_up(link: dict[str, Any]) -> bool:
    """Admin-up with carrier: state UP, or UNKNOWN (lo, tun, some virtual NICs) with UP and LOWER_UP flags."""
    flags = set(link["flags"])
    if "UP" not in flags or "NO-CARRIER" in flags:
        return False
    return link["state"] == "UP" or (link["state"] in ("UNKNOWN", None) and "LOWER_UP" in flags)


def check_ports(p: HostProbe) -> CheckResult:
    ports = p.job.all_ports if p.job else (p.rdzv_port,)
    sec = p.sections.get("ss")
    err = tool_error("ss", sec, p.options.probe_timeout_s)
    if err:
        return warned("ports", f"cannot check ports {', '.join(map(str, ports))}: {err}",
                      "install iproute2 (`ss`) on the host", ports=list(ports))
    assert sec is not None
    listening = parse_ss_listen(sec.output, sec.rc)
    busy = {l["port"]: l["address"] for l in listening if l["port"] in ports}
    if busy:
        port, addr = next(iter(busy.items()))
        return failed("ports", f"port {port} is in use (listening on {endpoint(addr, port)})",
                      f"find the owner with `ss -ltnp 'sport = :{port}'` and stop it, or choose another "
                      "rendezvous.port", ports=list(ports), busy=sorted(busy))
    return passed("ports", f"{', '.join(map(str, ports))} free", ports=list(ports), busy=[])


def _candidates(p: HostProbe) -> list[tuple[str, str]]:
    """(ip, how) pairs that should identify the host's NIC, best first."""
    out = []
    if is_ip(p.host.address):
        out.append((p.host.address, "inventory address"))
    else:
        g = p.sections.get("getent")
        if g is not None and g.rc == 0:
            for line in g.output.splitlines():
                f = line.split()
                if f and is_ip(f[0]):
                    out.append((f[0], f"{p.host.address} resolves to"))
    conn = p.sections.get("ssh_conn")
    if conn is not None:
        f = conn.output.split()
        if len(f) == 4 and is_ip(f[2]):
            out.append((f[2], "SSH connection address"))
    return out


def find_interface(p: HostProbe) -> tuple[str | None, str | None, str | None]:
    """(nic name, ip, how it was found) for the host, from clusterctl_interface or the address."""
    addr_sec = p.sections.get("ip_addr")
    addrs = parse_ip_addr(addr_sec.output) if addr_sec is not None and addr_sec.rc == 0 else []
    if p.host.interface:
        ip = next((a["address"] for a in addrs if a["name"] == p.host.interface and a["family"] == "inet"), None)
        return p.host.interface, ip, "clusterctl_interface"
    for ip, how in _candidates(p):
        norm = ipaddress.ip_address(ip.split("%", 1)[0])
        for a in addrs:
            if is_ip(a["address"]) and ipaddress.ip_address(a["address"]) == norm:
                return a["name"], ip, how
    return None, None, None


def check_interface(p: HostProbe) -> CheckResult:
    for tool in ("ip_addr", "ip_link"):
        err = tool_error("ip", p.sections.get(tool), p.options.probe_timeout_s)
        if err:
            return warned("interface", f"cannot list NICs: {err}", "install iproute2 (`ip`) on the host, or set "
                          "clusterctl_interface", name=p.host.interface)
    links = parse_ip_link(p.sections["ip_link"].output)
    name, ip, how = find_interface(p)
    if name is None:
        nics = ", ".join(l["name"] for l in links if l["name"] != "lo") or "none"
        return failed("interface", f"no NIC carries {p.host.address}", f"set clusterctl_interface for this host "
                      f"(NICs: {nics})", name=None)
    link = next((l for l in links if l["name"] == name), None)
    if link is None:
        nics = ", ".join(l["name"] for l in links if l["name"] != "lo") or "none"
        return failed("interface", f"no NIC named {name}", f"fix clusterctl_interface (NICs: {nics})", name=None)
    data = {"name": name, "address": ip, "state": link["state"], "mtu": link["mtu"]}
    if not link_is_up(link):
        return failed("interface", f"{name} is down (state {link['state']}, flags {','.join(link['flags'])})",
                      f"bring it up: `sudo ip link set {shlex.quote(name)} up`, and check the cable/switch port", **data)
    if how == "SSH connection address":
        return warned("interface", f"{p.host.address} is on no NIC; {name} carries the SSH connection's address "
                      f"{ip}", "set clusterctl_interface for this host to the NIC peers should use", **data)
    return passed("interface", f"{name} ({ip or 'no IPv4'}) up" + (f", mtu {link['mtu']}" if link["mtu"] else ""),
                  **data)


# Private: RFC 1918, IPv6 ULA, loopback. (ipaddress's is_private also counts documentation and other reserved
# ranges, which are routable on some networks: not used here.)
PRIVATE_NETWORKS = tuple(ipaddress.ip_network(n) for n in (
    "10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "127.0.0.0/8", "fc00::/7", "::1/128"))


def is_private_address(address: str) -> bool:
    """RFC 1918 / ULA / loopback (an IPv4-mapped IPv6 address counts as its IPv4 address)."""
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return False
    if ip.version == 6 and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return any(ip in n for n in PRIVATE_NETWORKS if n.version == ip.version)


def exposed_addresses(p: HostProbe) -> list[dict[str, Any]]:
    """Global addresses of the host outside the networks of its cluster NIC: a listener on all interfaces
    (as c10d's TCPStore is) is reachable through them."""
    addr_sec = p.sections.get("ip_addr")
    if addr_sec is None or addr_sec.rc != 0:
        return []
    addrs = parse_ip_addr(addr_sec.output)
    name, _, _ = find_interface(p)
    nets = [ipaddress.ip_interface(f"{a['address']}/{a['prefixlen']}").network for a in addrs if a["name"] == name]
    out = []
    for a in addrs:
        if a["scope"] != "global" or a["name"] == name or not is_ip(a["address"]):
            continue
        ip = ipaddress.ip_address(a["address"])
        if not any(ip in n for n in nets if n.version == ip.version):
            out.append({"name": a["name"], "address": a["address"]})
    return out



# ------------------------------------------------------------------------------------------------ probes, checks
# ------------------------------------------------------------------------------------------------ RDMA (issue 35)
# What the kernel exposes (Linux Documentation/ABI/stable/sysfs-class-infiniband): /dev/infiniband/uverbs*, the
# verbs devices a container needs (--device=/dev/infiniband); /sys/class/infiniband/<dev>/ports/<n>/state, e.g.
# "4: ACTIVE" (1: DOWN, 2: INIT, 3: ARMED, 4: ACTIVE, 5: ACTIVE_DEFER), and .../link_layer ("InfiniBand" or
# "Ethernet" for RoCE); /proc/modules lines ("nvidia_peermem 16384 0 - Live 0x0000000000000000 (OE)"):
# nvidia_peermem is GPUDirect RDMA's peer-memory module (NVIDIA GPUDirect RDMA documentation,
# https://docs.nvidia.com/cuda/gpudirect-rdma/). Fixed text, no user value.
RDMA_SCRIPT = (
    'for d in /dev/infiniband/uverbs*; do [ -e "$d" ] && echo "uverbs $d"; done; '
    'for p in /sys/class/infiniband/*/ports/*; do [ -r "$p/state" ] || continue; '
    'echo "port $p $(cat "$p/link_layer" 2>/dev/null || echo unknown) $(cat "$p/state")"; done; '
    "grep -E '^(nvidia_peermem|ib_uverbs|ib_core|mlx5_ib) ' /proc/modules 2>/dev/null | "
    "while read -r m _; do echo \"module $m\"; done; true")
_PORT_RE = re.compile(r"^port /sys/class/infiniband/([^/]+)/ports/(\d+) (\S+) (\d+): (\S+)$")


def parse_rdma(output: str, rc: int = 0) -> dict[str, Any]:
    """The RDMA probe (``RDMA_SCRIPT``) -> {"uverbs": [paths], "ports": [{"device", "port", "link_layer",
    "state"}], "modules": [names]}."""
    out: dict[str, Any] = {"uverbs": [], "ports": [], "modules": []}
    for line in output.splitlines():
        line = line.strip()
        m = _PORT_RE.match(line)
        if m:
            out["ports"].append({"device": m.group(1), "port": int(m.group(2)), "link_layer": m.group(3),
                                 "state": m.group(5)})
        elif line.startswith("uverbs /dev/infiniband/"):
            out["uverbs"].append(line.split(" ", 1)[1])
        elif line.startswith("module "):
            out["modules"].append(line.split(" ", 1)[1])
    return out


def parse_memlock(output: str, rc: int = 0) -> int | None:
    """``ulimit -H -l`` -> the hard memlock limit in KiB; -1 for ``unlimited``; None when unknown."""
    text = output.strip().splitlines()[0].strip() if output.strip() and rc == 0 else ""
    return -1 if text == "unlimited" else int(text) if text.isdigit() else None


MEMLOCK_FIX = ("raise the user's hard memlock limit (rootless podman cannot pass --ulimit memlock=-1 above it): "
               "`USER hard memlock unlimited` and `USER soft memlock unlimited` in /etc/security/limits.conf "
               "(sshd with UsePAM yes), log in again; or run the job with rootful podman")


def check_rdma(p: HostProbe) -> CheckResult:
    want = p.host.infiniband                   # True / False / None (auto)
    if want is False:
        return skipped("rdma", "clusterctl_infiniband: false")
    sec = p.sections.get("rdma")
    rdma = parse_rdma(sec.output, sec.rc) if sec is not None else parse_rdma("")
    active = [f"{x['device']}/{x['port']}" for x in rdma["ports"] if x["state"] == "ACTIVE"]
    peermem = "nvidia_peermem" in rdma["modules"]
    data = {"uverbs": rdma["uverbs"], "ports": rdma["ports"], "active": active, "nvidia_peermem": peermem,
            "infiniband": want}
    if not rdma["uverbs"]:
        if want:
            return failed("rdma", "clusterctl_infiniband: true but no RDMA device (/dev/infiniband/uverbs*)",
                          "load the RDMA drivers (`sudo modprobe ib_uverbs mlx5_ib`, or install MLNX_OFED/DOCA-OFED) "
                          "and check `ibv_devinfo`; or set clusterctl_infiniband: false for this host", **data)
        return skipped("rdma", "no RDMA device (clusterctl_infiniband: auto; NCCL uses sockets)", **data)
    if not active:
        states = ", ".join(f"{x['device']}/{x['port']} {x['state']}" for x in rdma["ports"]) or "no port state"
        return failed("rdma", f"{len(rdma['uverbs'])} RDMA devices, no port ACTIVE ({states})",
                      "check the cable and the subnet manager (`ibstat`; an InfiniBand port stays INIT without "
                      "one: `systemctl status opensm`), or set clusterctl_infiniband: false", **data)
    info = runtime_info(p)
    limit_sec = p.sections.get("memlock")
    hard = parse_memlock(limit_sec.output, limit_sec.rc) if limit_sec is not None else None
    data["memlock_hard_kib"] = hard
    if info is not None and info.get("rootless") and hard is not None and hard != -1:
        return failed("rdma", f"rootless podman refuses --ulimit memlock=-1 (the user's hard memlock limit is "
                      f"{hard} KiB) and RDMA pins memory", MEMLOCK_FIX, **data)
    layers = sorted({x["link_layer"] for x in rdma["ports"] if x["state"] == "ACTIVE"})
    gdr = "nvidia_peermem loaded" if peermem else "nvidia_peermem not loaded (GPUDirect RDMA only through dma-buf)"
    note = gdr if p.host.gpus != 0 else "CPU host"
    return passed("rdma", f"{len(rdma['uverbs'])} RDMA devices, {len(active)} ports ACTIVE "
                  f"({', '.join(layers)}); {note}", **data)


def _tool(name: str, *argv: str) -> Probe:
    return Probe(name, lambda host, job, o: section(name, tool_cmd(o.probe_timeout_s, argv)))


SS = _tool("ss", "ss", "-Hltn")
IP_ADDR = _tool("ip_addr", "ip", "-o", "addr", "show")
IP_LINK = _tool("ip_link", "ip", "-o", "link", "show")
SSH_CONN = Probe("ssh_conn", lambda host, job, o: "b ssh_conn; printf '%s' \"${SSH_CONNECTION:-}\"; e ssh_conn 0\n")
GETENT = Probe("getent", lambda host, job, o: section("getent", tool_cmd(o.probe_timeout_s,
                                                                         ("getent", "hosts", host.address))),
               applies=lambda host, job, o: not (is_ip(host.address) or host.interface))   # only to find the NIC
NIC_SECTIONS = ("ip_addr", "ip_link", "ssh_conn", "getent")

def _ib_possible(host, job, o) -> bool:
    return host.infiniband is not False


RDMA = Probe("rdma", lambda host, job, o: section("rdma", tool_cmd(o.probe_timeout_s, ("sh", "-c", RDMA_SCRIPT))),
             applies=_ib_possible)
MEMLOCK = Probe("memlock", lambda host, job, o: section("memlock", "ulimit -H -l"), applies=_ib_possible)
PORTS = Check("ports", "host", check_ports, ("ss",), label="ports", launch=True)
RDMA_CHECK = Check("rdma", "host", check_rdma, ("rdma", "memlock", "runtime_info"), label="rdma")
INTERFACE = Check("interface", "host", check_interface, NIC_SECTIONS, label="nic", launch=True)
