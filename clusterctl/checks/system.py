"""System checks: ssh (connection + command latency), clock offset and NTP state; their pure parsers."""
from __future__ import annotations

import shlex
from typing import TYPE_CHECKING, Any

from clusterctl.checks.model import Check, HostProbe, Probe, parse_epoch, section, tool_cmd
from clusterctl.checks.results import CheckResult, failed, passed, skipped, warned
from clusterctl.errors import AuthError, CommandTimeout, ConnectError, DeadlineExceeded, HostKeyError, TransportError

if TYPE_CHECKING:
    from clusterctl.config.inventory import Host


def parse_timedatectl(output: str, rc: int = 0) -> dict[str, Any]:
    """``timedatectl show -p NTPSynchronized --value`` -> {"ntp_synchronized": True|False|None (unknown)}."""
    v = output.strip().lower()
    return {"ntp_synchronized": (v == "yes") if rc == 0 and v in ("yes", "no") else None}


def clock_offset(remote_start: float, remote_end: float | None, sent: float, received: float
                 ) -> tuple[float, float]:
    """(offset, uncertainty) of the host's clock against the controller's. The script's own run time
    (remote_end - remote_start) is taken out of the round trip; the rest is split evenly (NTP style)."""
    elapsed = max(0.0, (remote_end - remote_start) if remote_end is not None else 0.0)
    transit = max(0.0, (received - sent) - elapsed)
    offset = remote_start - (sent + transit / 2)
    return offset, transit / 2


DEFAULT_KNOWN_HOSTS = "~/.ssh/known_hosts"


def ssh_hint(err: BaseException, host: "Host") -> str:
    """The fix for an SSH failure, as commands to copy. Every inventory value in them is quoted (issue 24: an
    ``ansible_user`` or ``clusterctl_known_hosts`` of ``$(curl ...|sh)`` must not become a command to paste)."""
    target = f"{host.user + '@' if host.user else ''}{host.address}"
    jump = getattr(host, "proxy_jump", None)
    route = (["-p", str(host.port)] if host.port else []) + (["-J", jump] if jump else [])  # the same route as ours
    ssh = shlex.join(["ssh", *route, target])
    if isinstance(err, HostKeyError):
        kh = getattr(host, "known_hosts", None)    # where the transport records keys
        into = shlex.quote(kh) if kh else DEFAULT_KNOWN_HOSTS
        if "HOST KEY CHANGED" in str(err):   # appending the new key would leave the stale one; the flag never helps
            return ("verify the new key out of band; then remove the old entry (`ssh-keygen -R` as shown above) "
                    "and rerun with --accept-new-host-keys")
        scan = shlex.join(["ssh-keyscan", *(["-p", str(host.port)] if host.port else []), host.address])
        if jump:   # ssh-keyscan cannot go through a bastion: scan from the bastion itself
            first = jump.split(",")[0]
            bastion, _, bport = first.rpartition(":") if ":" in first else (first, "", "")
            via = shlex.join(["ssh", *(["-p", bport] if bport else []), bastion])
            return (f"verify the host's fingerprint, then `{via} {shlex.quote(scan)} >> {into}` "
                    "(or rerun with --accept-new-host-keys)")
        return f"verify the host's fingerprint, then `{scan} >> {into}` (or rerun with --accept-new-host-keys)"
    if isinstance(err, AuthError):
        return f"check the key and user: `{ssh}` must work without a password (ansible_user, " \
               "ansible_ssh_private_key_file)"
    if isinstance(err, ConnectError):
        return f"check that the host is up and sshd listens: `{ssh} true`"
    if isinstance(err, (CommandTimeout, DeadlineExceeded)):
        return ("the host did not answer in time: run `nvidia-smi` and `docker info` there by hand (a wedged "
                "driver or daemon hangs), or raise the timeout")
    return f"run `{ssh} true` and fix the error it prints"


def check_ssh_error(err: BaseException, host: "Host") -> CheckResult:
    kind = getattr(err, "kind", type(err).__name__)
    message = err.message if isinstance(err, TransportError) else (str(err) or type(err).__name__)
    return failed("ssh", message, ssh_hint(err, host), error=kind)


def check_ssh(p: HostProbe) -> CheckResult:
    overhead = max(0.0, p.rtt_s - p.script_s)
    data = {"connect_s": round(p.connect_s, 4), "command_s": round(overhead, 4), "round_trip_s": round(p.rtt_s, 4)}
    if p.exit_code != 0 and not p.sections:
        return failed("ssh", f"the probe script failed (exit {p.exit_code}): {p.stderr.strip()[:200]}",
                      "the host needs a POSIX `sh`; run `sh -c true` there over ssh and fix the error", **data)
    text = f"connect {p.connect_s * 1000:.0f} ms, command {overhead * 1000:.0f} ms"
    if overhead > p.options.slow_command_s:
        return warned("ssh", f"slow commands: {text}", "a heavy login shell startup (conda/pyenv init in "
                      "~/.bashrc) slows every command: return early from ~/.bashrc when not interactive", **data)
    return passed("ssh", text, **data)


def check_clock(p: HostProbe) -> CheckResult:
    start = p.sections.get("clock0")
    remote_start = parse_epoch(start.output) if start else None
    if remote_start is None:
        return skipped("clock", "the host printed no time (`date +%s.%N`)")
    end = p.sections.get("clock1")
    offset, err = clock_offset(remote_start, parse_epoch(end.output) if end else None, p.sent, p.received)
    tds = p.sections.get("timedatectl")
    ntp = parse_timedatectl(tds.output, tds.rc)["ntp_synchronized"] if tds else None
    data = {"offset_s": round(offset, 4), "uncertainty_s": round(err, 4), "ntp_synchronized": ntp}
    certain = max(0.0, abs(offset) - err)   # judge only what the measurement can vouch for
    text = f"offset {offset:+.3f} s (±{err:.3f})" + {True: ", NTP synchronized", False: ", NTP not synchronized",
                                                     None: ""}[ntp]
    hint = "sync the clock: `sudo timedatectl set-ntp true` (or start chronyd/ntpd)"
    if certain > p.options.clock_fail_s:
        return failed("clock", text, hint, **data)
    if certain > p.options.clock_warn_s or ntp is False:
        return warned("clock", text, hint, **data)
    return passed("clock", text, **data)


# ------------------------------------------------------------------------------------------------ probes, checks
TIMEDATECTL = Probe("timedatectl", lambda host, job, o: section(
    "timedatectl", tool_cmd(o.probe_timeout_s, ("timedatectl", "show", "-p", "NTPSynchronized", "--value"))))
SSH = Check("ssh", "host", check_ssh, label="ssh", launch=True)     # run first: where it fails, the rest is skipped
CLOCK = Check("clock", "host", check_clock, ("timedatectl",), label="clock")   # clock0/clock1: every script has them
