"""Network checks: ``ss -Hltn`` and ``ip -o addr/link`` parsers (pure); ports and interface checks."""
from __future__ import annotations

import ipaddress
import re
import shlex
from typing import Any

from clusterctl.checks.model import Check, HostProbe, Probe, is_ip, section, tool_cmd, tool_error
from clusterctl.checks.results import CheckResult, failed, passed, warned
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

PORTS = Check("ports", "host", check_ports, ("ss",), label="ports", launch=True)
INTERFACE = Check("interface", "host", check_interface, NIC_SECTIONS, label="nic", launch=True)
