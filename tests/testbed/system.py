"""Low-level helpers: `ip` commands, processes in a network namespace, the uid-0 login account, mounts."""

from __future__ import annotations

import fcntl
import os
import re
import signal as signals
import subprocess
import time
from pathlib import Path

NETNS_DIR = Path("/run/netns")
USER_MARKER = "clusterctl-testbed"


def sh(argv: list[str], check: bool = True, timeout: float = 30, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(argv, check=check, capture_output=True, text=True, timeout=timeout, **kw)


def ip_batch(lines: list[str], netns: str | None = None) -> None:
    """Run many `ip` commands in one process (64 hosts: one fork instead of hundreds)."""
    if not lines:
        return
    argv = ["ip"] + (["-n", netns] if netns else []) + ["-batch", "-"]
    p = subprocess.run(argv, input="\n".join(lines) + "\n", capture_output=True, text=True, timeout=60)
    if p.returncode != 0:
        raise RuntimeError(f"ip -batch failed: {p.stderr.strip()}\n" + "\n".join(lines[:20]))


def link_exists(name: str) -> bool:
    return Path("/sys/class/net", name).exists()


def address_in_use(addr: str) -> str | None:
    """Name of a link in this namespace that already holds ``addr``, if any."""
    out = sh(["ip", "-o", "-4", "addr", "show"], check=False).stdout
    for line in out.splitlines():
        parts = line.split()
        if len(parts) > 3 and parts[3].split("/")[0] == addr:
            return parts[1]
    return None


def try_lock(path: Path) -> int | None:
    """An fd holding an exclusive flock on ``path`` (created 0600), or None when another process holds it. The lock
    lasts until the fd is closed or the process ends."""
    fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


_CLAIMED: dict[int, int] = {}     # octet -> the fd holding its lock, for this process's lifetime


def claim_octet(octets, registry: Path = Path("/run/clusterctl-testbed")) -> int | None:
    """The first 10.<octet>.0.0/24 of ``octets`` that no other process has claimed and no link here holds, claimed
    for this process (a lock file per octet: pytest-xdist workers build testbeds at the same moment, and looking
    for a free address is not enough between the look and the bridge being made). Freed when the process ends."""
    registry.mkdir(parents=True, exist_ok=True)
    for octet in octets:
        if octet in _CLAIMED or (fd := try_lock(registry / f"subnet-{octet}.lock")) is None:
            continue
        if address_in_use(f"10.{octet}.0.1") is not None:
            os.close(fd)
            continue
        _CLAIMED[octet] = fd
        return octet
    return None


def netns_pids(ns: str) -> list[int]:
    return pids_by_netns([ns])[ns]


def pids_by_netns(names: list[str]) -> dict[str, list[int]]:
    """Processes living in each named netns, found by namespace inode in one /proc scan (no fork)."""
    inodes = {}
    for name in names:
        try:
            st = os.stat(NETNS_DIR / name)
            inodes[(st.st_dev, st.st_ino)] = name
        except FileNotFoundError:
            pass
    out: dict[str, list[int]] = {name: [] for name in names}
    if not inodes:
        return out
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                st = os.stat(f"/proc/{entry}/ns/net")
            except OSError:
                continue
            if (name := inodes.get((st.st_dev, st.st_ino))) is not None:
                out[name].append(int(entry))
    return out


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def kill_pids(pids: list[int], sig: int = signals.SIGKILL) -> list[int]:
    killed = []
    for pid in pids:
        try:
            os.kill(pid, sig)
            killed.append(pid)
        except ProcessLookupError:
            pass
    return killed


def supervisors_using(subnet_prefix: str) -> list[int]:
    """Pids of clusterctl supervisors (``clusterctl ... _supervise JOB_ID``) whose job targets addresses starting
    with ``subnet_prefix`` (e.g. ``10.77.0.``): their job record (or its inventory file) names such an address.
    A testbed stops them before it goes down, so none keeps retrying addresses that then leave this machine."""
    import sqlite3

    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        # `python -m clusterctl.supervise --state-dir DIR JOB_ID`, or `clusterctl ... _supervise JOB_ID`
        mark = next((m for m in ("clusterctl.supervise", "_supervise") if m in argv), None)
        if mark is None or "--state-dir" not in argv:
            continue
        state_dir = argv[argv.index("--state-dir") + 1]
        after = [a for a in argv[argv.index(mark) + 1:] if not a.startswith("-")]
        job_id = (after[1] if mark == "clusterctl.supervise" and len(after) > 1 else after[0]) if after else ""
        texts = []
        try:
            db = sqlite3.connect(f"file:{state_dir}/state.db?mode=ro", uri=True, timeout=5)
            try:
                row = db.execute("SELECT spec_json, inventory_path FROM jobs WHERE job_id = ?", (job_id,)).fetchone()
            finally:
                db.close()
            if row:
                texts.append(row[0] or "")
                if row[1] and Path(row[1]).is_file():
                    texts.append(Path(row[1]).read_text(errors="replace"))
        except (sqlite3.Error, OSError):
            continue
        if any(subnet_prefix in t for t in texts):
            found.append(int(entry.name))
    return found


def kill_netns(names: list[str], deadline_s: float = 10.0) -> None:
    """SIGKILL everything living in these netns until nothing is left (children may appear while we kill)."""
    end = time.monotonic() + deadline_s
    while True:
        left = [pid for pids in pids_by_netns(names).values() for pid in pids]
        if not left:
            return
        if time.monotonic() > end:
            raise RuntimeError(f"processes in netns {names} survive SIGKILL: {left}")
        kill_pids(left)
        time.sleep(0.05)


def list_netns(prefix: str) -> list[str]:
    pat = re.compile(rf"^{re.escape(prefix)}\d+$")
    try:
        return sorted(n for n in os.listdir(NETNS_DIR) if pat.match(n))
    except FileNotFoundError:
        return []


def unmount_under(path: Path) -> None:
    """Lazily unmount anything mounted below ``path`` (e.g. container shm left by a killed conmon)."""
    root = str(path.resolve()).rstrip("/") + "/"
    targets = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        mp = line.split()[4].replace("\\040", " ")
        if mp.startswith(root):
            targets.append(mp)
    for mp in sorted(targets, key=len, reverse=True):
        sh(["umount", "-l", mp], check=False)


# --- uid-0 login account with a clean home -------------------------------------------------------------

def _edit_lines(path: Path, fn) -> None:
    with open("/etc/.clusterctl-testbed.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        old = path.read_text()
        lines = fn(old.splitlines())
        new = "\n".join(lines) + "\n"
        if new != old:
            st = path.stat()
            tmp = path.with_name(path.name + ".cctb")
            tmp.write_text(new)
            os.chmod(tmp, st.st_mode & 0o7777)
            os.chown(tmp, st.st_uid, st.st_gid)
            os.replace(tmp, path)


def _entry(lines: list[str], user: str) -> str | None:
    return next((ln for ln in lines if ln.split(":", 1)[0] == user), None)


def ensure_user(user: str, home: Path, uid: int = 0) -> None:
    """Add (or re-point) an account ``user`` (uid-0 unless ``uid``; gid = uid) with shell /bin/sh and ``home``;
    password ``*`` (no password, not locked). Refuses to touch an account of the same name that the testbed did
    not create."""
    passwd, shadow = Path("/etc/passwd"), Path("/etc/shadow")
    line = _entry(passwd.read_text().splitlines(), user)
    if line and USER_MARKER not in line:
        raise RuntimeError(f"user {user!r} exists and was not created by the testbed; pick another prefix")
    want = f"{user}:x:{uid}:{uid}:{USER_MARKER}:{home}:/bin/sh"
    _edit_lines(passwd, lambda ls: [ln for ln in ls if ln.split(":", 1)[0] != user] + [want])
    _edit_lines(shadow, lambda ls: [ln for ln in ls if ln.split(":", 1)[0] != user] + [f"{user}:*:19000:0:99999:7:::"])


def free_uid(start: int = 61000) -> int:
    """A uid no account has (for a non-root testbed login)."""
    used = {int(ln.split(":")[2]) for ln in Path("/etc/passwd").read_text().splitlines() if ln.count(":") >= 3
            and ln.split(":")[2].isdigit()}
    return next(u for u in range(start, start + 10000) if u not in used)


def remove_user(user: str) -> None:
    """Remove ``user`` only if the testbed created it."""
    if not (line := _entry(Path("/etc/passwd").read_text().splitlines(), user)) or USER_MARKER not in line:
        return
    for f in (Path("/etc/passwd"), Path("/etc/shadow")):
        _edit_lines(f, lambda ls: [ln for ln in ls if ln.split(":", 1)[0] != user])
