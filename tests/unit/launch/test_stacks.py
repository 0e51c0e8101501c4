"""stacks: the pure parser of py-spy output and the grouping. Fixtures (tests/fixtures/stacks): threads.txt,
gloo_all_reduce.txt and own_code.txt are real py-spy 0.4.3 dumps; synthetic_two_threads.txt is written by hand
(a second thread, full paths) for the parser's edge cases."""
from __future__ import annotations

from pathlib import Path

import pytest

from clusterctl.launch import runtimes
from clusterctl.launch import stacks
from clusterctl.launch.stacks import Frame, RankStack

FIX = Path(__file__).resolve().parents[2] / "fixtures" / "stacks"


def test_parse_dump_threads_innermost_first():
    threads = stacks.parse_dump((FIX / "threads.txt").read_text())     # real py-spy 0.4.3 output
    assert [t.name for t in threads] == ["MainThread", "loader"]
    main = stacks.main_thread(threads)
    assert main.status == "idle"
    assert main.frames == (Frame("hidden_wait_forever", "tka_spy.py", 4), Frame("train_step", "tka_spy.py", 8),
                           Frame("<module>", "tka_spy.py", 10))
    assert threads[1].frames[0] == Frame("Condition.wait", "threading.py", 327)
    assert len(threads[1].frames) == 6


def test_parse_dump_full_filenames_and_odd_lines():
    text = (FIX / "synthetic_two_threads.txt").read_text() + "\n    frame without line (<string>)\n        x = 1\n"
    main = stacks.main_thread(stacks.parse_dump(text))
    assert main.frames[0] == Frame("all_reduce", "/work/.venv/lib/python3.11/site-packages/torch/distributed/"
                                                 "distributed_c10d.py", 2806)
    assert [f.function for f in main.frames] == ["all_reduce", "wrapper", "wait_in_collective", "main", "<module>"]
    other = stacks.parse_dump(text)[1]
    assert other.frames[-1] == Frame("frame without line", "<string>", None)   # --locals values skipped
    assert stacks.parse_dump("") == [] and stacks.main_thread([]) is None
    assert stacks.parse_dump('Thread 0x7F12 (active+gil): "MainThread"\n    f (a.py:1)\n')[0].status == "active+gil"


def _node_output(*ranks: tuple[int, int, str, int]) -> str:
    out = []
    for pid, rank, dump, rc in ranks:
        out += [f"@@clusterctl-rank {pid} {rank}", dump, f"@@clusterctl-end {rc}"]
    return "\n".join(out + ["@@clusterctl-done"]) + "\n"


def test_parse_node_and_errors():
    gloo = (FIX / "synthetic_two_threads.txt").read_text()
    out = _node_output((11, 1, gloo, 0), (10, 0, gloo, 0),
                       (12, 2, "Error: Failed to get process executable name. Check that the process is running.\n"
                               "\nCaused by:\n    0: No such file", 1))
    got = stacks.parse_node("node1", out)
    assert [(s.rank, s.pid, s.error) for s in got[:2]] == [(0, 10, None), (1, 11, None)]
    assert got[2].error.startswith("Error: Failed to get process executable name") and got[2].frames == ()
    assert got[0].to_dict()["frames"][0] == {"function": "all_reduce", "file": "/work/.venv/lib/python3.11/"
                                             "site-packages/torch/distributed/distributed_c10d.py", "line": 2806}
    assert set(got[0].to_dict()) == {"node", "rank", "pid", "frames"}


def test_the_launchers_frames_are_left_out_so_ranks_of_different_nodes_group():
    """Every rank runs through clusterctl.rankview, whose file lies in a lib dir of its node and attempt (bare):
    its frames and the runpy ones below them are not the rank's (issue 37; before, ranks 0-1 on one node and 2
    on another were two groups)."""
    def dump(node):
        lib = f"/home/u/.clusterctl/nodes/{node}/jobs/j/1/lib/clusterctl/rankview.py"
        return ('Thread 0x7F12 (idle): "MainThread"\n    all_reduce (/v/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py:3252)\n'
                '    main (/job/hang.py:29)\n    <module> (/job/hang.py:34)\n'
                f'    run_file ({lib}:94)\n    main ({lib}:102)\n    <module> ({lib}:520)\n'
                '    _run_code (<frozen runpy>:88)\n    _run_module_as_main (<frozen runpy>:198)\n')
    got = stacks.parse_node("node3", _node_output((10, 0, dump("node3"), 0))) + \
        stacks.parse_node("node4", _node_output((11, 1, dump("node4"), 0)))
    assert [f.function for f in got[0].frames] == ["all_reduce", "main", "<module>"]
    assert stacks.summary(got) == ["ranks 0-1: all_reduce \u2190 main hang.py:29"]


def _rs(rank, frames, node="n1", error=None):
    return RankStack(node, rank, 100 + rank, tuple(frames), error)


COLL = [Frame("all_reduce", "/v/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py", 2806),
        Frame("train_step", "/job/train.py", 88), Frame("<module>", "/job/train.py", 120)]
SLEEP = [Frame("load_batch", "/job/data.py", 40), Frame("train_step", "/job/train.py", 80),
         Frame("<module>", "/job/train.py", 120)]


def test_group_and_summary():
    ss = [_rs(r, COLL, node=f"n{r // 4}") for r in range(7)] + [_rs(7, SLEEP, node="n1")]
    groups = stacks.group(ss)
    assert [[s.rank for s in g] for g, _ in groups] == [[0, 1, 2, 3, 4, 5, 6], [7]]
    assert stacks.summary(ss) == ["ranks 0-6: all_reduce \u2190 train_step train.py:88",
                                  "rank 7: load_batch data.py:40"]
    text = stacks.render(ss, {"n9": "unreachable"})
    assert text.splitlines()[:2] == stacks.summary(ss)
    assert "    all_reduce (/v/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py:2806)" in text
    assert text.endswith("n9: unreachable")
    assert stacks.hang_record(ss, {}) == "\n".join(stacks.summary(ss))
    assert stacks.hang_record([], {}) == "no rank process found"


def test_group_largest_first_and_errors():
    ss = [_rs(0, SLEEP), _rs(1, COLL), _rs(2, COLL), _rs(3, [], error="Error: permission denied")]
    assert stacks.summary(ss) == ["ranks 1-2: all_reduce \u2190 train_step train.py:88",
                                  "rank 0: load_batch data.py:40", "rank 3: py-spy failed: Error: permission denied"]
    # the same functions at another line are another stack
    moved = [Frame("all_reduce", COLL[0].file, 2806), Frame("train_step", "/job/train.py", 90), COLL[2]]
    assert len(stacks.group([_rs(0, COLL), _rs(1, moved)])) == 2


@pytest.mark.parametrize("ranks,text", [([7], "rank 7"), ([0, 1, 2, 5], "ranks 0-2,5"), ([3, 1, 2], "ranks 1-3"),
                                        ([0, 2, 4], "ranks 0,2,4")])
def test_ranks_text(ranks, text):
    assert stacks.ranks_text(ranks) == text


def test_where_library_frames():
    assert stacks.where([]) == "no Python frames"
    only_lib = [Frame("wait", "/usr/lib/python3.11/threading.py", 324), Frame("x", "<frozen runpy>", 1)]
    assert stacks.where(only_lib) == "wait threading.py:324"
    assert stacks.is_library("/opt/conda/lib/python3.10/site-packages/torch/x.py")
    assert stacks.is_library("/usr/lib/python3/dist-packages/numpy/x.py")
    assert not stacks.is_library("/home/me/proj/train.py")


def test_node_script_passes_values_as_argv():
    argv = stacks.node_argv("job-1", 3, "gpu 7")
    assert argv[:2] == ["sh", "-c"] and argv[2] == stacks.NODE_SCRIPT
    assert argv[3:] == ["clusterctl-stacks", "job-1", "3", "py-spy", str(stacks.DUMP_TIMEOUT_S), "gpu 7",
                        runtimes.warm_key("job-1", "gpu 7")]
    assert "job-1" not in stacks.NODE_SCRIPT


class _R:
    def __init__(self, code, out, err=""):
        self.exit_code, self.stdout, self.stderr = code, out, err


def test_collect_ships_py_spy_only_when_missing(tmp_path, monkeypatch):
    binary = tmp_path / "py-spy"
    binary.write_bytes(b"\x7fELF fake")
    binary.chmod(0o755)
    monkeypatch.setattr(stacks, "spy_binary", lambda: binary)
    calls = []
    dump = (FIX / "synthetic_two_threads.txt").read_text()

    def run_on(node):
        def run(argv, timeout, stdin=None):
            calls.append((node, argv[6], stdin))
            if node == "a" and argv[6] == "py-spy":
                return _R(3, "@@clusterctl-no-py-spy\n")
            return _R(0, _node_output((50 if node == "a" else 60, 0 if node == "a" else 1, dump, 0)))
        return run

    found, errors = stacks.collect(["a", "b"], run_on, "j", 1)
    assert errors == {}
    assert [(s.node, s.rank) for s in found] == [("a", 0), ("b", 1)]
    assert sorted(calls, key=str) == sorted([("a", "py-spy", None), ("a", "-", b"\x7fELF fake"),
                                             ("b", "py-spy", None)], key=str)


def test_collect_reports_node_failures():
    def run_on(node):
        def run(argv, timeout, stdin=None):
            if node == "gone":
                raise OSError("no route")
            return _R(0, "@@clusterctl-done\n") if node == "empty" else _R(1, "", "sh: broken")
        return run

    found, errors = stacks.collect(["gone", "empty", "bad"], run_on, "j", 1)
    assert found == []
    assert errors["gone"] == "no route" and errors["empty"] == "no rank process of this attempt found"
    assert "sh: broken" in errors["bad"]


def test_real_torch_hang_fixtures():
    """Real py-spy 0.4.3 dumps (--full-filenames) of tests/integration/jobs/hang.py under torchrun (gloo)."""
    coll = stacks.main_thread(stacks.parse_dump((FIX / "gloo_all_reduce.txt").read_text()))
    own = stacks.main_thread(stacks.parse_dump((FIX / "own_code.txt").read_text()))
    assert [f.function for f in coll.frames] == ["all_reduce", "_exception_logger.<locals>.wrapper",
                                                 "wait_in_collective", "main", "<module>"]
    assert coll.frames[0].file.endswith("site-packages/torch/distributed/distributed_c10d.py")
    assert [(f.function, f.line) for f in own.frames] == [("stuck_in_own_code", 12), ("main", 28), ("<module>", 34)]
    ss = [RankStack("n1", r, r, coll.frames) for r in range(3)] + [RankStack("n2", 3, 3, own.frames)]
    assert stacks.summary(ss) == ["ranks 0-2: all_reduce \u2190 wait_in_collective hang.py:16",
                                  "rank 3: stuck_in_own_code hang.py:12"]
