"""Cluster-wide checks. Phase-2 scripts (temporary rendezvous listener, peer connect + shared-storage read)
and the pure checks over all hosts' probes.

Phase 2 costs one command per host: the rendezvous host runs the listener (which also removes the
shared-storage nonce file once every peer has connected, i.e. after every peer has read it); each peer reads
the nonce file, then connects.
"""
from __future__ import annotations

import shlex
from collections import defaultdict
from typing import Any, Mapping

from clusterctl.checks.model import MARKERS, Check, HostProbe, Probe, Section, first_line, split_sections
from clusterctl.checks.network import NIC_SECTIONS, exposed_addresses, find_interface, is_private_address
from clusterctl.checks.results import CheckResult, ClusterCheck

# Listens on all interfaces (as c10d's TCPStore does) until N peers connected or the timeout; then removes
# the nonce file (argv[5]) if every peer came. argv: port, peers, timeout_s, family (4|6), [cleanup path].
LISTENER_PY = r"""
import os, socket, sys, time
port, n, t, fam = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
s = socket.socket(socket.AF_INET6 if fam == "6" else socket.AF_INET)
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
try:
    s.bind(("::" if fam == "6" else "", port)); s.listen(128)
except OSError as e:
    print("bind-error", e, flush=True); sys.exit(3)
print("listening", flush=True)
end, peers = time.monotonic() + t, []
while len(peers) < n:
    left = end - time.monotonic()
    if left <= 0:
        break
    s.settimeout(left)
    try:
        c, a = s.accept()
    except socket.timeout:
        break
    peers.append(a[0]); c.close()
s.close()
print("peers", len(peers), " ".join(peers), flush=True)
if len(sys.argv) > 5 and len(peers) >= n:
    try:
        os.remove(sys.argv[5]); print("removed")
    except OSError as e:
        print("remove-error", e)
"""

# argv: address, port, timeout_s. Retries until the listener is up (it starts at about the same time).
CONNECT_PY = r"""
import socket, sys, time
h, p, t = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
end, err = time.monotonic() + t, "timed out"
while True:
    left = end - time.monotonic()
    if left <= 0:
        break
    try:
        socket.create_connection((h, p), timeout=min(2.0, left)).close()
        print("connected"); sys.exit(0)
    except OSError as e:
        err = str(e) or type(e).__name__
        time.sleep(min(0.1, max(0.0, end - time.monotonic())))
print("failed", err); sys.exit(1)
"""

_BASH_TCP = 'exec 3<>"/dev/tcp/$1/$2"'
CONNECT_BASH = (
    'end=$(( $(date +%s) + ${3%.*} + 1 )); while :; do '
    f'if timeout 2 bash -c {shlex.quote(_BASH_TCP)} _ "$1" "$2" 2>/dev/null; then echo connected; exit 0; fi; '
    'if [ "$(date +%s)" -ge "$end" ]; then echo "failed could not connect"; exit 1; fi; sleep 0.2; done'
)

def listener_script(port: int, peers: int, timeout_s: float, ipv6: bool, cleanup: str | None) -> str:
    args = [str(port), str(peers), f"{timeout_s:g}", "6" if ipv6 else "4"] + ([cleanup] if cleanup else [])
    return ("if command -v python3 >/dev/null 2>&1; then "
            f"exec python3 -c {shlex.quote(LISTENER_PY)} {shlex.join(args)}; "
            "else echo no-python3; exit 3; fi\n")


def peer_script(address: str | None, port: int, timeout_s: float, nonce_file: str | None) -> str:
    parts = [MARKERS]
    if nonce_file:
        parts.append(f"b nonce_read; cat -- {shlex.quote(nonce_file)} 2>&1; e nonce_read $?\n")
    if address:
        args = shlex.join([address, str(port), f"{timeout_s:g}"])
        parts.append(
            "b connect; if command -v python3 >/dev/null 2>&1; then "
            f"python3 -c {shlex.quote(CONNECT_PY)} {args} 2>&1; "
            f"elif command -v bash >/dev/null 2>&1; then bash -c {shlex.quote(CONNECT_BASH)} _ {args} 2>&1; "
            "else echo 'failed no python3 or bash to test the connection'; false; fi; e connect $?\n")
    return "".join(parts)


def parse_listener(output: str, rc: int = 0) -> dict[str, Any]:
    """Listener output -> {"listening", "peers", "removed", "error"}."""
    out: dict[str, Any] = {"listening": False, "peers": [], "removed": False, "error": None}
    for line in output.splitlines():
        word, _, rest = line.strip().partition(" ")
        if word == "listening":
            out["listening"] = True
        elif word == "peers":
            out["peers"] = rest.split()[1:]
        elif word == "removed":
            out["removed"] = True
        elif word in ("bind-error", "no-python3", "remove-error") and not out["error"]:
            out["error"] = {"bind-error": f"cannot listen: {rest}", "no-python3": "python3 not found",
                            "remove-error": f"cannot remove the nonce file: {rest}"}[word]
    if rc not in (0, None) and not out["error"]:
        out["error"] = first_line(output) or f"exit {rc}"
    return out


def parse_peer(output: str, rc: int = 0) -> dict[str, Any]:
    """Peer script output -> {"nonce": text|None, "nonce_error", "connected": bool|None, "connect_error"}."""
    sec = split_sections(output)
    out: dict[str, Any] = {"nonce": None, "nonce_error": None, "connected": None, "connect_error": None}
    nr: Section | None = sec.get("nonce_read")
    if nr is not None:
        if nr.rc == 0:
            out["nonce"] = nr.output.strip()
        else:
            out["nonce_error"] = first_line(nr.output) or f"exit {nr.rc}"
    c: Section | None = sec.get("connect")
    if c is not None:
        out["connected"] = c.rc == 0 and "connected" in c.output
        if not out["connected"]:
            msg = first_line(c.output)
            out["connect_error"] = msg[len("failed "):] if msg.startswith("failed ") else (msg or f"exit {c.rc}")
    return out


# ------------------------------------------------------------------------------------------------ checks
def check_rendezvous(rdzv: str, endpoint: str, results: Mapping[str, dict[str, Any] | BaseException],
                     listener: dict[str, Any] | None) -> ClusterCheck:
    """``results``: peer name -> parse_peer() value or the transport error."""
    hint_fw = (f"open TCP {endpoint.rpartition(':')[2]} (and the ephemeral ports torch uses for MASTER_PORT) "
               f"from every host to {rdzv} in the firewall / security group")
    hosts = (rdzv, *results)
    if listener is not None and listener.get("error"):
        return ClusterCheck("rendezvous_reachable", "fail" if "cannot listen" in listener["error"] else "skip",
                            f"{rdzv}: {listener['error']}",
                            "free the port on the rendezvous host (see ports)" if "cannot listen" in listener["error"]
                            else None, (rdzv,))
    bad = {}
    for name, r in results.items():
        if isinstance(r, BaseException):
            bad[name] = f"no answer ({getattr(r, 'message', r)})"
        elif not r.get("connected"):
            bad[name] = r.get("connect_error") or "did not try"
    if bad:
        first = next(iter(bad.items()))
        more = f" (+{len(bad) - 1} more)" if len(bad) > 1 else ""
        return ClusterCheck("rendezvous_reachable", "fail", f"{first[0]} cannot reach {endpoint}: {first[1]}{more}",
                            hint_fw, tuple(bad))
    return ClusterCheck("rendezvous_reachable", "pass", f"{len(results)} hosts reached {endpoint}", None, hosts)


def check_shared_storage(rdzv: str, directory: str, nonce: str, written: Section | None,
                         results: Mapping[str, dict[str, Any] | BaseException]) -> ClusterCheck:
    hint = f"mount the same shared filesystem (NFS, Lustre, ...) at {directory} on every host"
    if written is None or written.rc != 0:
        err = first_line(written.output) if written else "not written"
        if "no such directory" in err:
            return ClusterCheck("shared_storage", "warn", f"{directory} does not exist on {rdzv}; cannot verify",
                                f"create it on the shared filesystem: `mkdir -p {shlex.quote(directory)}`", (rdzv,))
        return ClusterCheck("shared_storage", "fail", f"cannot write to {directory} on {rdzv}: {err}",
                            f"make {directory} writable by the SSH user on every host", (rdzv,))
    bad = {}
    for name, r in results.items():
        if isinstance(r, BaseException):
            bad[name] = f"no answer ({getattr(r, 'message', r)})"
        elif r.get("nonce") != nonce:
            bad[name] = "sees a different file" if r.get("nonce") else (r.get("nonce_error") or "file not found")
    if bad:
        names = ", ".join(bad)
        return ClusterCheck("shared_storage", "fail", f"{directory} is not shared: a file written on {rdzv} is "
                            f"missing on {names} ({next(iter(bad.values()))})", hint, tuple(bad))
    return ClusterCheck("shared_storage", "pass", f"{directory} is shared by {len(results) + 1} hosts", None,
                        (rdzv, *results))


def _split(values: Mapping[str, str]) -> tuple[str, list[str], str]:
    """(majority value, hosts that differ, description) for one attribute."""
    groups: dict[str, list[str]] = defaultdict(list)
    for host, v in values.items():
        groups[v].append(host)
    ranked = sorted(groups.items(), key=lambda kv: -len(kv[1]))
    odd = [h for _, hs in ranked[1:] for h in hs]
    desc = "; ".join(f"{v} on {', '.join(hs[:3])}{' ...' if len(hs) > 3 else ''}" for v, hs in ranked)
    return ranked[0][0], odd, desc


def check_consistency(checks: Mapping[str, Mapping[str, CheckResult]]) -> ClusterCheck:
    """Same driver, image and GPU model everywhere (from each host's gpu_driver / image / gpu_count data)."""
    attrs = {
        "driver": ("gpu_driver", lambda c: c.data.get("version")),
        "image": ("image", lambda c: c.data.get("id")),
        "GPU model": ("gpu_count", lambda c: ", ".join(c.data.get("models") or []) or None),
    }
    problems, odd_hosts, checked = [], [], set()
    for label, (cid, get) in attrs.items():
        values = {h: get(cs[cid]) for h, cs in checks.items() if cid in cs and cs[cid].status != "skip"}
        values = {h: v for h, v in values.items() if v}
        checked |= set(values)
        if len(set(values.values())) > 1:
            _, odd, desc = _split(values)
            problems.append(f"{label} differs: {desc}")
            odd_hosts += [h for h in odd if h not in odd_hosts]
    if not checked:
        return ClusterCheck("consistency", "skip", "no driver, image or GPU data to compare", None, ())
    if problems:
        return ClusterCheck("consistency", "warn", "; ".join(problems), "use the same driver version, image "
                            "(pull the same tag everywhere) and GPU model on every host of a job",
                            tuple(odd_hosts))
    return ClusterCheck("consistency", "pass", "same driver, image and GPU model on every host", None,
                        tuple(sorted(checked, key=list(checks).index)))


def check_hostnames(names: Mapping[str, str | None]) -> ClusterCheck:
    known = {h: n for h, n in names.items() if n}
    if not known:
        return ClusterCheck("hostnames", "skip", "no hostnames collected", None, ())
    groups: dict[str, list[str]] = defaultdict(list)
    for h, n in known.items():
        groups[n].append(h)
    dup = {n: hs for n, hs in groups.items() if len(hs) > 1}
    if dup:
        n, hs = next(iter(dup.items()))
        return ClusterCheck("hostnames", "fail", f"hostname {n!r} is used by {', '.join(hs)}",
                            "give every host a unique hostname (`sudo hostnamectl set-hostname NAME`): NCCL "
                            "tells nodes apart by hostname", tuple(h for hs in dup.values() for h in hs))
    return ClusterCheck("hostnames", "pass", f"{len(known)} unique hostnames", None, tuple(known))


def check_exposure(probe: HostProbe, port: int) -> ClusterCheck:
    """Heuristic, no traffic: does the rendezvous host have global addresses outside its cluster NIC's network?
    (Reachability from outside is not tested.)"""
    name = probe.host.name
    if "ip_addr" not in probe.sections or probe.sections["ip_addr"].rc != 0:
        return ClusterCheck("rendezvous_exposure", "skip", f"no address list from {name}", None, (name,))
    _, rdzv_ip, _ = find_interface(probe)
    if rdzv_ip and not is_private_address(rdzv_ip):
        return ClusterCheck("rendezvous_exposure", "warn", f"the rendezvous address {rdzv_ip} ({name}:{port}) is not "
                            f"private (RFC 1918 / ULA / loopback): c10d/TCPStore listens there", f"use a private "
                            f"cluster network for the rendezvous host's address, or firewall TCP {port} and the "
                            f"ephemeral ports: c10d/TCPStore runs code sent by anyone who can connect", (name,))
    exposed = exposed_addresses(probe)
    if exposed:
        where = ", ".join(f"{e['address']} ({e['name']})" for e in exposed[:4])
        return ClusterCheck("rendezvous_exposure", "warn", f"{name}:{port} will listen on all interfaces, including "
                            f"{where} outside the cluster network", f"firewall TCP {port} and the ephemeral ports "
                            "on those addresses: c10d/TCPStore runs code sent by anyone who can connect", (name,))
    return ClusterCheck("rendezvous_exposure", "pass", f"{name} has no global address outside the cluster network",
                        None, (name,))



# ------------------------------------------------------------------------------------------------ probes, checks
HOSTNAME = Probe("hostname", lambda host, job, o: "b hostname; (hostname || uname -n) 2>&1; e hostname $?\n")
# judged over every host by preflight's cluster phase (rendezvous_reachable and shared_storage in phase 2)
RENDEZVOUS = Check("rendezvous_reachable", "cluster")
SHARED_STORAGE = Check("shared_storage", "cluster")
CONSISTENCY = Check("consistency", "cluster", needs=("nvidia_smi", "runtime_info", "image"))
HOSTNAMES = Check("hostnames", "cluster", needs=("hostname",))
EXPOSURE = Check("rendezvous_exposure", "cluster", needs=NIC_SECTIONS, launch=True)   # only warns
