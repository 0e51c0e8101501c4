"""The node-side log coalescer (``runtimes.COALESCE``) with the real sh, dd, mkfifo: every byte in order, the end
of the output ends it (with the command's exit status), lines written one by one arrive in a few chunks, and
nothing is left running when the stream is stopped (the SSH stream wrapper's kill, a closed reader, the local
transport's stop). And the controller's side: ``LogSink`` fed those chunks writes the bytes it wrote when every
line came on its own."""
from __future__ import annotations

import os
import random
import signal
import subprocess
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

from clusterctl import runtimes
from clusterctl.inventory import Host
from clusterctl.launcher import MAX_LINE, RANK_PREFIX, LogSink
from clusterctl.transport.base import ConnectOptions
from clusterctl.transport.local import LocalTransport
from clusterctl.transport.ssh import STREAM_WRAPPER

# a writer that sends file $2 on in pieces with pauses, as file $1 says ("SIZE PAUSE" lines)
PIECES = ('exec 3<"$1" 4<"$2"; while read -r n p <&3; do dd bs="$n" count=1 iflag=fullblock <&4 2>/dev/null; '
          '[ "$p" = 0 ] || sleep "$p"; done')


def reads(p: subprocess.Popen) -> list[tuple[float, bytes]]:
    """Every read of ``p``'s stdout until EOF: (time since start, bytes)."""
    out, t0 = [], time.monotonic()
    while True:
        data = os.read(p.stdout.fileno(), 1 << 20)
        if not data:
            return out
        out.append((time.monotonic() - t0, data))


def group(pgid: int) -> list[str]:
    """The live processes of process group ``pgid`` (their command lines)."""
    found = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            stat = Path(f"/proc/{d}/stat").read_text().rsplit(")", 1)[1].split()
            if int(stat[2]) == pgid and stat[0] != "Z":
                found.append(Path(f"/proc/{d}/cmdline").read_text().replace("\0", " ").strip())
        except (OSError, IndexError, ValueError):
            continue
    return found


def gone(pgid: int, timeout: float = 5.0) -> list[str]:
    """Waits until group ``pgid`` is empty; returns what is still there."""
    end = time.monotonic() + timeout
    while (left := group(pgid)) and time.monotonic() < end:
        time.sleep(0.05)
    return left


def test_every_byte_passes_in_order_whatever_the_pieces(tmp_path):
    rnd = random.Random(15)
    data = bytes(rnd.randrange(256) for _ in range(300_000)) + b"no newline at the end"
    plan, left = [], len(data)
    while left:
        n = min(left, rnd.choice([1, 7, 100, 4096, 30_000, 65_536, 100_000]))
        plan.append(f"{n} {rnd.choice(['0', '0', '0.05', '0.3'])}")
        left -= n
    (tmp_path / "data").write_bytes(data)
    (tmp_path / "plan").write_text("\n".join(plan) + "\n")
    argv = runtimes.coalesced(["sh", "-c", PIECES, "w", str(tmp_path / "plan"), str(tmp_path / "data")], 0.2)
    p = subprocess.Popen(argv, stdout=subprocess.PIPE)
    got = b"".join(d for _, d in reads(p))
    assert p.wait(10) == 0
    assert got == data


def test_a_large_output_is_not_held_back(tmp_path):
    """A catch-up from the start of a long log (here 8 MB at once): full reads go on without the pause."""
    big = b"".join(b"%08d %s\n" % (i, b"y" * 90) for i in range(80_000))
    (tmp_path / "big").write_bytes(big)
    t0 = time.monotonic()
    p = subprocess.Popen(runtimes.coalesced(["cat", str(tmp_path / "big")]), stdout=subprocess.PIPE)
    got = b"".join(d for _, d in reads(p))
    took = time.monotonic() - t0
    assert p.wait(10) == 0 and got == big
    assert took < 15, took       # 8 MB at 64 KiB per 0.5 s would take 62 s


def test_ends_with_the_output_and_keeps_the_commands_exit_status():
    p = subprocess.Popen(runtimes.coalesced(["sh", "-c", "echo out; echo err >&2; exit 7"], 0.2),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err = p.communicate(timeout=10)
    assert p.returncode == 7
    assert out == b"out\nerr\n" and err == b""     # stderr comes in the one stream, after stdout here


def test_lines_written_one_by_one_arrive_in_a_few_chunks():
    """50 lines in ~1 s, one write each: a handful of reads, not 50."""
    w = 'i=0; while [ "$i" -lt 50 ]; do echo "seq $i"; i=$((i + 1)); sleep 0.02; done'
    t0 = time.monotonic()
    p = subprocess.Popen(runtimes.coalesced(["sh", "-c", w]), stdout=subprocess.PIPE)
    got = reads(p)
    took = time.monotonic() - t0
    assert p.wait(10) == 0
    assert b"".join(d for _, d in got) == b"".join(b"seq %d\n" % i for i in range(50))
    # one read at the start, then one per 0.5 s while it writes (+1 for its last piece); a loaded machine
    # stretches the writer's second, so the bound follows how long it took
    assert len(got) <= max(4, int(took / 0.5) + 2), (took, [(round(t, 2), len(d)) for t, d in got])


def test_nothing_is_left_when_the_ssh_channel_closes(tmp_path):
    """The SSH stream wrapper (what sshd runs) kills the command when the channel's stdin ends: the coalescer
    passes that on to the follow command (an idle `tail -F`), and nothing of the stream is left."""
    log = tmp_path / "node.log"
    log.write_text("first\n")
    argv = runtimes.get("bare").logs_argv(runtimes.Ref("c", str(tmp_path), str(log)), follow=True)
    p = subprocess.Popen(["sh", "-c", STREAM_WRAPPER, "clusterctl-stream", *argv], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, start_new_session=True)
    try:
        assert os.read(p.stdout.fileno(), 100) == b"first\n"
        assert any(c.startswith("tail ") for c in group(p.pid))
        p.stdin.close()                  # the channel closed
        assert gone(p.pid) == []
        assert p.wait(5) != 0
    finally:
        if group(p.pid):
            os.killpg(p.pid, signal.SIGKILL)
        p.wait()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT])
def test_a_signal_to_the_coalescer_ends_the_follow_command(tmp_path, sig):
    log = tmp_path / "node.log"
    log.write_text("")
    p = subprocess.Popen(runtimes.coalesced(["tail", "-F", str(log)]), stdout=subprocess.PIPE,
                         start_new_session=True)
    try:
        end = time.monotonic() + 5
        while not any(c.startswith("tail ") for c in group(p.pid)) and time.monotonic() < end:
            time.sleep(0.05)
        p.send_signal(sig)
        assert p.wait(5) == 128 + sig
        assert gone(p.pid) == []
    finally:
        if group(p.pid):
            os.killpg(p.pid, signal.SIGKILL)
        p.wait()


def test_a_reader_gone_ends_it_and_the_follow_command(tmp_path):
    """The channel gone without a signal (its pipe closed): the next write fails, the follow command is killed."""
    log = tmp_path / "node.log"
    log.write_text("a\n")
    p = subprocess.Popen(runtimes.coalesced(["tail", "-F", "-n+1", str(log)], 0.1), stdout=subprocess.PIPE,
                         start_new_session=True)
    try:
        assert os.read(p.stdout.fileno(), 100) == b"a\n"
        p.stdout.close()
        with open(log, "a") as f:
            f.write("b\n")
        assert p.wait(5) != 0
        assert gone(p.pid) == []
    finally:
        if group(p.pid):
            os.killpg(p.pid, signal.SIGKILL)
        p.wait()


def test_without_a_usable_tmpdir_it_runs_the_command_as_before():
    env = {**os.environ, "TMPDIR": "/nonexistent/clusterctl"}
    r = subprocess.run(runtimes.coalesced(["sh", "-c", "echo a; exit 3"]), capture_output=True, env=env,
                       timeout=10)
    assert (r.returncode, r.stdout) == (3, b"a\n")
    assert not Path("/nonexistent").exists()


def test_local_transport_stop_ends_the_whole_follow(tmp_path):
    """The local transport's stream (its own session) is stopped with a kill of its process group: a SIGKILL of
    the coalescer alone would leave the follow command running."""
    log = tmp_path / "node.log"
    log.write_text("x\n")
    t = LocalTransport(Host(name="l", address="127.0.0.1", connection="local", runtime="bare", gpus=0),
                       ConnectOptions())
    argv = runtimes.get("bare").logs_argv(runtimes.Ref("c", str(tmp_path), str(log)), follow=True)
    stop, got = threading.Event(), []
    th = threading.Thread(target=t.stream, args=(argv, got.append, stop), daemon=True)
    th.start()
    end = time.monotonic() + 5
    while not got and time.monotonic() < end:
        time.sleep(0.05)
    tails = [pid for pid in os.listdir("/proc") if pid.isdigit() and _cmdline(pid).startswith("tail ") and str(log) in _cmdline(pid)]
    assert got == [b"x\n"] and len(tails) == 1
    stop.set()
    th.join(5)
    assert not th.is_alive()
    end = time.monotonic() + 5
    while os.path.exists(f"/proc/{tails[0]}") and _state(tails[0]) != "Z" and time.monotonic() < end:
        time.sleep(0.05)
    assert not os.path.exists(f"/proc/{tails[0]}") or _state(tails[0]) == "Z"


def _cmdline(pid: str) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_text().replace("\0", " ")
    except OSError:
        return ""


def _state(pid: str) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "Z"


def test_follow_argv_is_the_plain_one_under_the_coalescer_and_tail_reads_are_unchanged(tmp_path):
    ref = runtimes.Ref("clusterctl-a-1_n1", "/x/1", "/x/1/node.log", "a-1")
    for name in runtimes.names():
        rt = runtimes.get(name)
        follow = rt.logs_argv(ref, follow=True)
        assert follow[:5] == ["sh", "-c", runtimes.COALESCE, "clusterctl-coalesce", "0.5"]
        assert runtimes.COALESCE not in rt.logs_argv(ref, tail=5) and runtimes.COALESCE not in rt.logs_argv(ref)
        plain = rt.logs_argv(ref)
        assert follow[5:8] == plain[:3]          # the same command, with its follow option


# ------------------------------------------------------------------------------- the controller's side: LogSink
def _old_lines(node: str, stream: list[bytes]) -> tuple[bytes, list[str], Counter]:
    """LogSink before the node coalesced its output: fed one line at a time, each line formatted on its own with
    ``RANK_PREFIX`` (a regex on bytes) and decoded on its own. Returns the file's bytes, the echoed lines and the
    lines per rank."""
    out, partial = [], b""
    for data in stream:
        *lines, partial = (partial + data).split(b"\n")
        while len(partial) > MAX_LINE:
            lines.append(partial[:MAX_LINE])
            partial = partial[MAX_LINE:]
        for line in lines:
            m = RANK_PREFIX.match(line)
            rank = m.group(1).decode() if m else "-"
            text = line[m.end():] if m else line
            out.append((rank, f"[{node}/{rank}] {text.decode(errors='replace').rstrip()}"))
    return ("".join(t + "\n" for _, t in out).encode(), [t for _, t in out], Counter(r for r, _ in out))


TRICKY = [b"[0]:plain", b"[12]:  trailing spaces   ", b"[3]:", b"[3]:\r", b"crlf line\r", b"", b"   ",
          b"[x]:not a rank", b"[1a]:no", b"[]:empty", b"[1]no colon", b"[\xef\xbc\x91]:fullwidth digit",
          b"[\xd9\xa1]:arabic-indic digit", b"\xff\xfe invalid", b"truncated \xe2\x82", b"\x82\xac stray",
          b"nbsp end\xc2\xa0", b"nel end\xc2\x85", b"raw nel \x85", b"ls end\xe2\x80\xa8", b"vt\x0b ff\x0c fs\x1c",
          b"[7]:euro \xe2\x82\xac ok", b"[5]:tab\t", b"[0]:x]:y", b"[00]:leading zero", b"[0]:[1]:nested",
          b"[99999]:big rank", b" [0]:indented", b"W agent line [0]: not at the start",
          b"x" * 70_000 + b"\xe2\x82\xac" * 30_000, b"[4]:" + b"y" * 65_534 + b"\xc3\xa9 straddles"]


@pytest.mark.parametrize("node", ["node1", "12]:x", "n\\1\\g<0>"])
def test_log_sink_fed_in_chunks_writes_the_bytes_of_the_line_by_line_copy(tmp_path, node):
    rnd = random.Random(7)
    lines = [rnd.choice(TRICKY) if rnd.random() < 0.3 else b"[%d]:seq %d" % (rnd.randrange(8), i)
             for i in range(3000)]
    stream = b"".join(line + b"\n" for line in lines) + b"[1]:no newline yet, then a long tail " + b"z" * 140_000
    for case, n_cuts in enumerate([5, 50, 500, 3000]):
        cuts = sorted(rnd.sample(range(1, len(stream)), n_cuts))
        pieces = [stream[a:b] for a, b in zip([0, *cuts], [*cuts, len(stream)])]
        echoed: list[str] = []
        sink = LogSink(tmp_path / f"out{case}.log", echo=echoed.append)
        for piece in pieces:
            sink.feed(node, piece)
        sink.close()
        # what a line longer than MAX_LINE is cut into depends on where the stream's pieces end (MAX_LINE of a
        # line without its newline yet is written, not held): compare with the old copy fed the same pieces
        want, want_echo, want_ranks = _old_lines(node, pieces)
        assert (tmp_path / f"out{case}.log").read_bytes() == want
        assert echoed == want_echo
        assert sink.copied[node] == want_ranks
        # lines up to MAX_LINE: the same bytes as when every line came in a piece of its own
        short = [line for line in lines if len(line) <= MAX_LINE]
        sink = LogSink(tmp_path / f"short{case}.log")
        data = b"".join(line + b"\n" for line in short)
        for a, b in zip([0, *cuts], [*cuts, len(stream)]):
            sink.feed(node, data[a:b])
        sink.close()
        assert (tmp_path / f"short{case}.log").read_bytes() == _old_lines(node, [x + b"\n" for x in short])[0]


def test_log_sink_skips_a_reread_then_copies_in_chunks(tmp_path):
    """A reconnect streams the whole log again: what the file holds is skipped per rank, the rest copied."""
    sink = LogSink(tmp_path / "out.log")
    sink.begin("n1", 1)
    sink.feed("n1", b"[0]:a\n[1]:b\n[0]:c\n")
    sink.restart("n1")
    sink.feed("n1", b"[1]:b\n[0]:a\n[0]:c\n[1]:d\n[0]:e\n")
    assert sink._skip["n1"] == Counter()
    sink.feed("n1", b"[0]:f\nagent\n")
    assert (tmp_path / "out.log").read_text().splitlines() == [
        "[n1/-] === attempt 1 ===", "[n1/0] a", "[n1/1] b", "[n1/0] c", "[n1/1] d", "[n1/0] e", "[n1/0] f",
        "[n1/-] agent"]
    assert sink.copied["n1"] == Counter({"0": 4, "1": 2, "-": 1})
