"""supervise/rankwatch: every rank's dump fetched from a node (the real DUMP script in sh, real rank monitors acting
on its trigger, the tar sent back and unpacked), bounded, and safe against what a job can plant in its view dir."""
from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from clusterctl import rankview
from clusterctl.supervise import rankwatch
from clusterctl.transport.base import CommandResult


@dataclass(frozen=True)
class _Host:
    name: str


def _run(node, argv, timeout):
    t = time.monotonic()
    p = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout)
    return CommandResult(tuple(argv), p.returncode, p.stdout, p.stderr, time.monotonic() - t)


def _ranks(view: Path, ranks: list[int], stop: threading.Event) -> threading.Thread:
    """Monitors of ``ranks`` acting on the dump trigger, as each rank's thread does once a second."""
    mons = [rankview.Monitor(str(view), rank=r, local_rank=r, progress=rankview.Progress()) for r in ranks]

    def loop():
        while not stop.is_set():
            for m in mons:
                m.check_trigger()
            time.sleep(0.05)

    t = threading.Thread(target=loop, daemon=True)
    t.start()
    return t


def test_every_ranks_dump_and_stack_come_back_and_a_silent_rank_is_named(tmp_path):
    view = tmp_path / "view"
    view.mkdir()
    for r in (0, 1, 2):      # rank 2 has a view file but never answers (stopped)
        (view / f"rank-{r}").write_text(json.dumps({"rank": r, "n": 1}) + "\n")
    outside = tmp_path / "outside"
    outside.write_text("keep\n")
    os.symlink(outside, view / ".dump.tmp")             # planted by the job: never written through
    stop = threading.Event()
    t = _ranks(view, [0, 1], stop)
    dest = tmp_path / "hang-1"
    try:
        start = time.monotonic()
        errors = rankwatch.dump_ranks(_run, {"n1": str(view)}, {"n1": _Host("n1")}, str(dest), wait_s=1.0)
        took = time.monotonic() - start
    finally:
        stop.set()
        t.join()
    assert errors == {"n1": "no dump from rank(s) 2 within 1s"}, errors
    assert took < 6
    names = sorted(p.name for p in dest.iterdir())
    assert names[-2:] == ["stack-0.txt", "stack-1.txt"] and {n.split(".")[0] for n in names[:-2]} == {"fr-0", "fr-1"}
    assert all(oct(p.stat().st_mode & 0o777) == "0o600" for p in dest.iterdir())
    assert "rank 1 pid" in (dest / "stack-1.txt").read_text()
    assert outside.read_text() == "keep\n"
    assert (view / "dump").read_text().startswith("dump-")


def test_a_node_without_a_view_or_an_answer_is_an_error_not_a_wait(tmp_path):
    errors = rankwatch.dump_ranks(_run, {"n1": str(tmp_path / "none")}, {"n1": _Host("n1")}, str(tmp_path / "d"),
                                  wait_s=1.0)
    assert errors == {"n1": f"no rank view in {tmp_path / 'none'}"}


def test_unpack_keeps_only_regular_dump_files(tmp_path):
    import base64
    import io
    import tarfile

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in (("fr-3", b"x"), ("stack-3.txt", b"y"), ("evil.sh", b"z"), ("../up", b"w")):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        link = tarfile.TarInfo("fr-4")
        link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
        tar.addfile(link)
    got = rankwatch.unpack(base64.b64encode(buf.getvalue()).decode(), tmp_path / "d")
    assert got == ["fr-3", "stack-3.txt"] and sorted(p.name for p in (tmp_path / "d").iterdir()) == got
