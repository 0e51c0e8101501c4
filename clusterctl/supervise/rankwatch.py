"""The rank view on the controller's side of ``ClusterOps``: what the watches heard of every rank
(``rank_views``) and every rank's flight-recorder dump and stack, fetched on a hang (``dump_ranks``).

The node side is clusterctl/rankview.py (a thread in each rank writing ``<view dir>/rank-<RANK>``, the view dir
being ``runtimes.view_dir(node_dir)``); the node's watch brings those files with its line (``watch.Watch.ranks``).
A dump is asked for with a file ``<view dir>/dump`` naming a fresh directory beside it (``DUMP``): each rank writes
``fr-<RANK>`` and ``stack-<RANK>.txt`` there, and the same command waits for them (at most ``wait_s``) and sends
them back as a base64 tar (every file of the node at once, one bounded command per node).
"""
from __future__ import annotations

import base64
import io
import os
import re
import tarfile
import time
from pathlib import Path
from typing import Callable, Mapping, Sequence

from clusterctl.model.ranks import RankView
from clusterctl.supervise.watch import Watches
from clusterctl.transport import fan_out

DUMP_WAIT_S = 5.0
DUMP_FILE = re.compile(r"(fr-[0-9]+(\.error)?|stack-[0-9]+\.txt)")
MAX_DUMP_BYTES = 64 << 20       # of one node's tar (a 2,000-entry flight record is a few hundred KB per rank)

# $1 the view dir (a leading ~/ is the node's $HOME)  $2 a fresh name for the dump's dir  $3 tenths of a second to
# wait: write the trigger (whole: a temp file, then mv), wait until every rank with a view file has written its
# stack and its flight record (or why not: fr-R.error), then print a base64 tar of what is there. Exit 3: no view
# dir; 4: nothing came. Each rank missing is named on stderr. The job's processes can write in the view dir (a
# container's are mounted there) and this runs as the node's user: the temp file is made new (noclobber: never
# through a symlink planted there), the dump's dir is not entered through a symlink, and tar keeps symlinks as
# links (``unpack`` takes regular files only).
DUMP = r'''v=$1 name=$2 tenths=$3
case $v in "~/"*) v=$HOME/${v#"~/"};; esac
[ -d "$v" ] || { echo "no rank view in $v" >&2; exit 3; }
rm -f -- "$v/.dump.tmp"; (set -C; printf '%s\n' "$name" >"$v/.dump.tmp") && mv -f -- "$v/.dump.tmp" "$v/dump" || exit 1
d=$v/$name; i=0
while :; do
  missing=
  for f in "$v"/rank-*; do
    [ -e "$f" ] || continue
    r=${f##*/rank-}
    { [ -e "$d/stack-$r.txt" ] && { [ -e "$d/fr-$r" ] || [ -e "$d/fr-$r.error" ]; }; } || missing="$missing $r"
  done
  [ -z "$missing" ] && break
  [ "$i" -ge "$tenths" ] && { echo "no dump from rank(s)$missing within $((tenths / 10))s" >&2; break; }
  sleep 0.1; i=$((i + 1))
done
[ ! -L "$d" ] && cd -- "$d" 2>/dev/null || exit 4
set --
for f in fr-* stack-*; do [ -f "$f" ] && set -- "$@" "$f"; done
[ "$#" -gt 0 ] || exit 4
tar cf - -- "$@" | base64
'''


def rank_views(watches: Watches, nodes: Sequence[str], attempt: int) -> dict[str, dict[int, RankView]]:
    """node -> rank -> what the node's watch of ``attempt`` last heard of the rank (nodes without a view left out)."""
    out = {}
    for node in nodes:
        w = watches.get(node)
        if w is not None and w.attempt == attempt:
            views = watches.rank_views(node)
            if views:
                out[node] = views
    return out


def dump_argv(view_dir: str, name: str, wait_s: float = DUMP_WAIT_S) -> list[str]:
    return ["sh", "-c", DUMP, "clusterctl-dump", view_dir, name, str(int(wait_s * 10))]


def unpack(stdout: str, dest: Path) -> list[str]:
    """Write the dump files of a ``DUMP`` output into ``dest`` (0600 each; only ``fr-N``, ``fr-N.error`` and
    ``stack-N.txt``, regular files: nothing else a node sends is written). Returns their names."""
    data = base64.b64decode("".join(stdout.split()), validate=True)
    if len(data) > MAX_DUMP_BYTES:
        raise ValueError(f"a dump of {len(data)} bytes (at most {MAX_DUMP_BYTES})")
    dest.mkdir(mode=0o700, parents=True, exist_ok=True)
    names = []
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tar:
        for m in tar.getmembers():
            name = m.name[2:] if m.name.startswith("./") else m.name
            if not m.isfile() or not DUMP_FILE.fullmatch(name):
                continue
            f = tar.extractfile(m)
            if f is None:
                continue
            _write_private(dest / name, f.read())
            names.append(name)
    return names


def _write_private(path: Path, data: bytes) -> None:
    """``data`` into ``path``, 0600, through a temp file beside it (never through a symlink planted there)."""
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)
    os.replace(tmp, path)


def dump_ranks(run: Callable[..., object], view_dirs: Mapping[str, str], hosts: Mapping[str, object],
               dest_dir: str, *, wait_s: float = DUMP_WAIT_S, connect_timeout_s: float = 10.0) -> dict[str, str]:
    """Every rank's flight-recorder dump and stack, from each node (``view_dirs``: node -> its view dir) into
    ``dest_dir``. ``run(node, argv, timeout=...)`` runs a command on a node. Returns node -> why not (only the
    nodes that failed, or that sent less than every rank's)."""
    name = f"dump-{time.time_ns()}"
    dest = Path(dest_dir)
    timeout = wait_s + 15

    def one(host) -> str:
        r = run(host.name, dump_argv(view_dirs[host.name], name, wait_s), timeout=timeout)
        if not r.ok and not r.stdout.strip():
            return (r.stderr.strip() or f"exit code {r.exit_code}")[-300:]
        unpack(r.stdout, dest)
        return r.stderr.strip()[-300:]

    results = fan_out([hosts[n] for n in view_dirs], one, host_timeout=connect_timeout_s + timeout + 5)
    out = {}
    for r in results:
        if r.error is not None:
            out[r.host.name] = str(r.error)[-300:] or type(r.error).__name__
        elif r.value:
            out[r.host.name] = r.value
    return out
