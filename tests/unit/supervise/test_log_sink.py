"""The controller's log copy: ``LogSink`` fed a node's output in pieces of any size writes the bytes it wrote when
every line came on its own (its formatting works on a piece at once), and skips a reread per rank."""
from __future__ import annotations

import random
from collections import Counter

import pytest

from clusterctl.store.logcopy import MAX_LINE, RANK_PREFIX, LogSink


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
