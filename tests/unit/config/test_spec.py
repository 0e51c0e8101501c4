"""Job file validation: every error is an InputError with its exact FILE:LINE: key: message."""
from __future__ import annotations

import glob
import os
from importlib import resources

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from clusterctl.config.spec import JobSpec, load_job, loads_job
from clusterctl.errors import InputError

FIXTURES = os.path.join(os.path.dirname(__file__), "..", "..", "fixtures", "jobs")
CASES = sorted(glob.glob(os.path.join(FIXTURES, "*.yaml")))


def _expected(path: str) -> str:
    with open(path, encoding="utf-8") as f:
        first = f.readline()
    assert first.startswith("# expect: "), f"{path}: first line must be '# expect: ...'"
    return first[len("# expect: "):].rstrip("\n")


@pytest.mark.parametrize("path", CASES, ids=[os.path.basename(p) for p in CASES])
def test_fixture(path):
    expect = _expected(path)
    if expect == "ok":
        assert isinstance(load_job(path), JobSpec)
        return
    with pytest.raises(InputError) as e:
        load_job(path)
    want = f"{path}:{expect}" if expect[0].isdigit() else f"{path}: {expect}"
    assert str(e.value) == want


def test_full_example_values():
    s = load_job(os.path.join(FIXTURES, "ok-full.yaml"))
    assert (s.min_nodes, s.max_nodes, s.elastic) == (2, 4, True)
    assert s.nodes == "2:4"                                   # not YAML 1.1's base-60 integer 124
    assert s.args == ["--epochs", "10", "--lr", "0.001", "--time", "1:30"]
    assert s.env == {"NCCL_DEBUG": "WARN", "OMP_NUM_THREADS": "4"}
    assert s.torchrun == ["python3", "-m", "torch.distributed.run"]
    assert s.container.ulimits == {}
    assert s.rendezvous.port == 29500 and s.rendezvous.join_timeout == 120 and s.rendezvous.last_call_timeout == 30
    assert s.source.endswith("ok-full.yaml")


def test_defaults():
    s = loads_job("name: a\nscript: t.py\n")
    assert s.image == "pytorch-cuda:v2.7-ssh"
    assert (s.nodes, s.min_nodes, s.max_nodes, s.elastic) == (1, 1, 1, False)
    assert s.nproc_per_node == 1 and s.torchrun == ["torchrun"] and s.workdir is None
    assert s.rendezvous.port == 29400 and s.rendezvous.join_timeout == 300 and s.rendezvous.host is None
    assert (s.checkpoint.dir, s.checkpoint.keep, s.checkpoint.verify) == (None, 3, "size")
    r = s.restarts
    assert (r.max_restarts, r.max_failures, r.max_node_failures, r.backoff_s, r.backoff_max_s) == (3, 3, 10, 1, 30)
    sv = s.supervisor
    assert (sv.probe_interval_s, sv.probe_failures, sv.hang_timeout_s) == (1, 2, 300)
    assert (sv.stuck_timeout_s, sv.stragglers) == (20, "warn")
    c = s.container
    assert (c.ipc, c.shm_size, c.ulimits, c.extra_args) == ("host", None, {"memlock": "-1", "stack": "67108864"}, [])
    assert s.hosts is None


def test_fixed_nodes_as_string_and_int():
    assert loads_job("name: a\nscript: t.py\nnodes: '3'\n").nodes == 3
    assert loads_job("name: a\nscript: t.py\nnodes: 3:3\n").nodes == 3
    assert loads_job("name: a\nmodule: pkg.train\nnodes: 4\n").max_nodes == 4


def test_secret_values_never_in_spec():
    s = loads_job("name: a\nscript: t.py\nsecret_env: [WANDB_API_KEY]\n")
    assert s.secret_env == ["WANDB_API_KEY"]
    assert "WANDB_API_KEY" not in s.env


def test_file_errors(tmp_path):
    with pytest.raises(InputError, match="file not found"):
        load_job(str(tmp_path / "nope.yaml"))
    bad = tmp_path / "bin.yaml"
    bad.write_bytes(b"name: \xff\n")
    with pytest.raises(InputError, match=r"bin.yaml:1: not UTF-8 \(byte 0xff\): save the file as UTF-8"):
        load_job(str(bad))


def test_template_job_yaml_loads():
    path = resources.files("clusterctl.templates").joinpath("job.yaml")
    with resources.as_file(path) as p:
        s = load_job(str(p))
    # the template documents the defaults: it must equal the defaults
    d = s.model_dump()
    base = loads_job("name: my-job\nscript: train.py\n").model_dump()
    assert d == base


def test_docs_mention_every_key():
    doc = open(os.path.join(os.path.dirname(__file__), "..", "..", "..", "docs", "job.md"), encoding="utf-8").read()
    for key, f in JobSpec.model_fields.items():
        assert f"`{key}`" in doc, key
        sub = f.annotation
        if isinstance(sub, type) and hasattr(sub, "model_fields"):
            for k in sub.model_fields:
                assert f"`{key}.{k}`" in doc, f"{key}.{k}"


# ------------------------------------------------------------------ never anything but InputError

_KEYS = ["name", "image", "nodes", "nproc_per_node", "script", "module", "args", "workdir", "env", "secret_env",
         "mounts", "torchrun", "rendezvous", "checkpoint", "restarts", "supervisor", "container", "hosts", "port",
         "ulimits", "ipc", "shm_size", "dir", "keep", "verify", "host", "backoff_s", "backoff_max_s", "join_timeout"]
_SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(), st.text(max_size=12),
                     st.sampled_from(["2:3", "gpu", "/a:/b", "x", "-x", "3:1", "yes", "0", "a/b", "/x:/y:ro"]))
_VALUES = st.recursive(_SCALARS, lambda c: st.one_of(
    st.lists(c, max_size=4),
    st.dictionaries(st.one_of(st.sampled_from(_KEYS), st.text(max_size=5), st.integers()), c, max_size=4)),
    max_leaves=20)
_DOCS = st.dictionaries(st.sampled_from(_KEYS), _VALUES, max_size=8).map(lambda d: yaml.safe_dump(d))


@settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.one_of(_DOCS, st.text(max_size=120)))
def test_load_job_only_raises_input_error(text):
    try:
        loads_job(text, "fuzz.yaml")
    except InputError as e:
        assert str(e).startswith("fuzz.yaml")


@pytest.mark.parametrize("key,value", [("restarts.backoff_s", ".inf"), ("restarts.window", ".inf"),
                                       ("supervisor.hang_timeout_s", ".nan"), ("restarts.backoff_max_s", "-.inf")])
def test_infinite_and_nan_numbers_are_refused_at_their_line(key, value):
    """`.inf` passed validation and crashed the supervisor, `status` and `stop` (issue 24 item 13)."""
    section, field = key.split(".")
    with pytest.raises(InputError) as e:
        loads_job(f"name: j\nscript: t.py\n{section}:\n  {field}: {value}\n", file="job.yaml")
    assert e.value.line == 4 and e.value.key == key


def test_stuck_timeout_and_stragglers_keys():
    """Issue 37: supervisor.stuck_timeout_s (0 = off) and supervisor.stragglers (warn | relaunch)."""
    s = loads_job("name: j\nscript: t.py\nsupervisor:\n  stuck_timeout_s: 0\n  stragglers: relaunch\n")
    assert (s.supervisor.stuck_timeout_s, s.supervisor.stragglers) == (0, "relaunch")
    with pytest.raises(InputError) as e:
        loads_job("name: j\nscript: t.py\nsupervisor:\n  stragglers: kill\n", file="job.yaml")
    assert e.value.line == 4 and e.value.key == "supervisor.stragglers"
    with pytest.raises(InputError) as e:
        loads_job("name: j\nscript: t.py\nsupervisor:\n  stuck_timeout_s: -1\n", file="job.yaml")
    assert e.value.key == "supervisor.stuck_timeout_s"


def test_every_problem_of_a_job_file_is_reported_at_once_in_line_order():
    with pytest.raises(InputError) as e:
        loads_job("Name: j\nscript: t.py\nnodes: 0\nrestarts:\n  backoff_s: -1\n", file="job.yaml")
    lines = str(e.value).splitlines()
    assert lines == ["job.yaml:1: name: required key is missing",
                     "job.yaml:1: Name: unknown key 'Name' (did you mean 'name'?)",
                     "job.yaml:3: nodes: must be >= 1, got 0",
                     "job.yaml:5: restarts.backoff_s: must be >= 0.0, got -1"]


def test_args_and_env_numbers_keep_the_text_as_written():
    """YAML re-prints numbers (1.10 -> 1.1, 010 -> 8, 0x1F -> 31, 3.0e-4 -> 0.0003): args/env keep the file's text."""
    s = loads_job("name: j\nscript: t.py\nargs: [--lr, 3.0e-4, --v, 1.10, 010, 0x1F, 7, '1.10']\n"
                  "env: {A: 1.10, B: 0x1F, C: 010}\n")
    assert list(s.args) == ["--lr", "3.0e-4", "--v", "1.10", "010", "0x1F", "7", "1.10"]
    assert dict(s.env) == {"A": "1.10", "B": "0x1F", "C": "010"}
