"""Per-host podman configuration and the local test image.

Each host gets its own containers.conf (runc, cgroupfs, no default ulimits, read-only mounts of the host's
/usr, the Python install, the venv and the repo, read-write shared storage) and its own storage.conf (vfs,
per-host graphroot/runroot), selected through CONTAINERS_CONF / CONTAINERS_STORAGE_CONF in the host's sshd
``SetEnv``. Its container and volume locks are files under its own tmp_dir (``lock_type = "file"``): podman's
default is one shared-memory segment per machine (/dev/shm/libpod_lock, 2048 locks) that a host's store, removed
with the testbed, never gives back (the jobs' compile-cache volumes outlive their containers by design); after a
day of testbeds every podman on the machine failed with "allocating lock ...: exceeded num_locks (2048)". The image is imported once into a template store and copied into each host's store (the libpod
database is left out: podman creates it per store on first use).
"""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

IMAGE = "localhost/pytorch-cuda:v2.7-ssh"
REPO_ROOT = Path(__file__).resolve().parents[2]


def mounts(shared: Path) -> list[str]:
    """Volumes every container gets: host /usr, Python install, venv, repo (ro), shared storage (rw)."""
    ro = {Path("/usr"), Path(sys.base_prefix).resolve(), Path(sys.prefix).resolve(), REPO_ROOT}
    seen: list[Path] = []
    for p in sorted(ro, key=lambda p: len(p.parts)):  # parents before children
        if p.exists() and not any(s == p or s in p.parents for s in seen):
            seen.append(p)
    vols = [f"{p}:{p}:ro" for p in seen]
    vols.append(f"{shared}:{shared}:rw")
    return vols


def write_configs(host_dir: Path, runroot: Path, shared: Path) -> dict[str, str]:
    """Write containers.conf + storage.conf for one host; return the env that selects them."""
    cc = host_dir / "containers.conf"
    sc = host_dir / "storage.conf"
    vols = ", ".join(f'"{v}"' for v in mounts(shared))
    cc.write_text(
        "[containers]\n"
        "default_ulimits = []\n"
        f"volumes = [{vols}]\n"
        "[engine]\n"
        'runtime = "runc"\n'
        'cgroup_manager = "cgroupfs"\n'
        f'tmp_dir = "{runroot}/libpod-tmp"\n'
        'lock_type = "file"\n'                     # locks in tmp_dir/locks, gone with the testbed (see above)
        'events_logger = "file"\n'
        f'events_logfile_path = "{host_dir}/podman-events.log"\n'
    )
    sc.write_text(
        "[storage]\n"
        'driver = "vfs"\n'
        f'graphroot = "{host_dir / "storage"}"\n'
        f'runroot = "{runroot}"\n'
    )
    return {"CONTAINERS_CONF": str(cc), "CONTAINERS_STORAGE_CONF": str(sc)}


def rootfs_tar() -> bytes:
    """An almost empty rootfs: usr-merge symlinks and empty mount points."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for d in ("usr", "proc", "sys", "dev", "etc", "tmp", "run", "var", "root"):
            info = tarfile.TarInfo(d)
            info.type = tarfile.DIRTYPE
            info.mode = 0o1777 if d == "tmp" else 0o755
            tar.addfile(info)
        for link, target in (("bin", "usr/bin"), ("lib", "usr/lib"), ("lib64", "usr/lib64"), ("sbin", "usr/sbin")):
            info = tarfile.TarInfo(link)
            info.type = tarfile.SYMTYPE
            info.linkname = target
            tar.addfile(info)
    return buf.getvalue()


def build_template(template_dir: Path, runroot: Path, shared: Path) -> Path:
    """Import the image into a template store under ``template_dir``; return the store path."""
    env = dict(os.environ, **write_configs(template_dir, runroot, shared))
    tar = template_dir / "rootfs.tar"
    tar.write_bytes(rootfs_tar())
    venv_bin = Path(sys.prefix).resolve() / "bin"
    subprocess.run(
        ["podman", "import", "--quiet",
         "--change", f"ENV PATH={venv_bin}:/usr/bin:/bin",
         "--change", 'CMD ["sleep","infinity"]',
         str(tar), IMAGE],
        env=env, check=True, capture_output=True, text=True, timeout=120,
    )
    return template_dir / "storage"


def copy_store(template_store: Path, dest_store: Path) -> None:
    """Copy the image layers/metadata (not the libpod db) of the template store into a host store."""
    dest_store.mkdir(parents=True, exist_ok=True)
    for entry in template_store.iterdir():
        if entry.name == "libpod":
            continue
        target = dest_store / entry.name
        if entry.is_dir():
            shutil.copytree(entry, target, symlinks=True, dirs_exist_ok=True)
        else:
            shutil.copy2(entry, target)


def podman_used(store: Path) -> bool:
    """Whether podman ever ran against this store (so it may hold containers or their mounts)."""
    return (store / "libpod").exists()
