"""Fuzz the input loaders: whatever the inventory or job file holds, the only failures are clean errors.

``clusterctl.config.inventory.parse_data`` / ``parse`` and ``clusterctl.config.spec.loads_job`` must either return a value or
raise ``InputError``/``UserError`` (exit 2, ``FILE:LINE: message``) -- never a ``KeyError``, ``TypeError``,
``RecursionError`` or any other exception that would reach the user as an internal error. Bounded example counts
so this runs in CI in seconds (docs/security.md).
"""
from __future__ import annotations

import re

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from clusterctl.config import inventory
from clusterctl.config.inventory import KNOWN_VARS, Inventory
from clusterctl.config.spec import JobSpec, loads_job
from clusterctl.errors import InputError, UserError

SETTINGS = settings(max_examples=250, deadline=None, suppress_health_check=list(HealthCheck))
WHERE = re.compile(r"^[^:]+(:\d+)?: ")   # FILE: or FILE:LINE: at the start of every message

# --------------------------------------------------------------------------------------------- strategies
hostile_text = st.one_of(
    st.text(max_size=12),
    st.sampled_from(["", "-", "--rm", "-oProxyCommand=touch /tmp/x", "$(id)", "`id`", "a;b", "a && b", "a\nb",
                     "'", '"', "\\", "~", "..", "../x", "/", "a/b", "[1:3]", "n[01:99999]", "n[a:0]", "n[9:1]",
                     "n[0:4:0]", "\x00", "ü", "💥", " ", "all", "hosts", "vars", "children", "yes", "null", "0x10",
                     "1:30", "2:4", "4:2", "0", "-1", "65536", "gpu", "\t", "\r"]),
)
scalars = st.one_of(st.none(), st.booleans(), st.integers(min_value=-2**70, max_value=2**70),
                    st.floats(allow_nan=True), hostile_text)


def nested(leaves):
    return st.recursive(leaves, lambda ch: st.one_of(st.lists(ch, max_size=4),
                                                      st.dictionaries(hostile_text | st.integers(), ch, max_size=4)),
                        max_leaves=12)


any_value = nested(scalars)
var_names = st.one_of(st.sampled_from(sorted(KNOWN_VARS)), st.sampled_from(["ansible_hots", "clusterctl_gpu",
                                                                              "site", "ansible_", "clusterctl_x"]),
                      hostile_text)
var_values = st.one_of(scalars, st.integers(min_value=-5, max_value=70000), st.sampled_from(
    ["ssh", "local", "docker", "podman", "bare", "eth0", "root", "10.0.0.1", "-x", "a b"]), any_value)
host_vars = st.dictionaries(var_names, var_values, max_size=4)
host_names = st.one_of(st.sampled_from(["node1", "node2", "gpu[01:03]", "n[a:c]", "all", "g1"]), hostile_text)


@st.composite
def group(draw, depth=0):
    g = {}
    if draw(st.booleans()):
        g["hosts"] = draw(st.one_of(st.dictionaries(host_names, st.none() | host_vars, max_size=4), any_value))
    if draw(st.booleans()):
        g["vars"] = draw(st.one_of(host_vars, any_value))
    if depth < 2 and draw(st.booleans()):
        g["children"] = draw(st.dictionaries(host_names, st.none() | group(depth + 1), max_size=3))
    if draw(st.integers(0, 9)) == 0:
        g[draw(hostile_text)] = draw(any_value)
    return g


inventories = st.one_of(
    st.builds(lambda g, extra: {"all": g, **extra}, group(),
              st.dictionaries(host_names, st.none() | group(1), max_size=2)),
    any_value,
)

JOB_KEYS = sorted(JobSpec.model_fields) + ["nmae", "extra"]
SUB_KEYS = {
    "rendezvous": ["port", "host", "join_timeout", "last_call_timeout", "read_timeout", "bogus"],
    "checkpoint": ["dir", "keep", "verify", "bogus"],
    "restarts": ["max_restarts", "max_failures", "backoff_s", "backoff_max_s", "bogus"],
    "supervisor": ["probe_interval_s", "probe_failures", "hang_timeout_s", "bogus"],
    "container": ["ipc", "shm_size", "ulimits", "extra_args", "bogus"],
}
job_values = st.one_of(scalars, any_value, st.sampled_from(
    ["train.py", "/abs/train.py", "pkg.mod", "-x", "2:4", "gpu", "host", "private", "16g", "sha256", "size",
     "torchrun", "python3 -m torch.distributed.run", "'unterminated", "/a:/b:ro", "a:b", "/a:/b:xx"]),
    st.integers(min_value=-3, max_value=70000))


@st.composite
def jobs(draw):
    d = {"name": draw(st.one_of(st.just("job-1"), hostile_text, scalars))}
    if draw(st.booleans()):
        d["script"] = "/abs/train.py"
    for k in draw(st.lists(st.sampled_from(JOB_KEYS), max_size=6, unique=True)):
        if k in SUB_KEYS and draw(st.booleans()):
            d[k] = draw(st.dictionaries(st.sampled_from(SUB_KEYS[k]), job_values, max_size=3))
        elif k in ("env", "container") and draw(st.booleans()):
            d[k] = draw(st.dictionaries(hostile_text, job_values, max_size=3))
        else:
            d[k] = draw(job_values)
    return d


def _clean(fn, *args):
    """Run a loader; a clean error is fine, anything else fails the test (with the input shown by hypothesis)."""
    try:
        return fn(*args)
    except (InputError, UserError) as e:
        assert str(e), "an error without a message"
        assert WHERE.match(str(e)), f"error does not start with FILE[:LINE]: {e}"
        assert "Traceback" not in str(e)
        return e


def _dump(data) -> str | None:
    try:
        return yaml.safe_dump(data, allow_unicode=True)
    except (yaml.YAMLError, ValueError, TypeError):
        return None


# --------------------------------------------------------------------------------------------- inventory
@SETTINGS
@given(inventories)
def test_inventory_parse_data_only_clean_errors(data):
    r = _clean(inventory.parse_data, data, "inv.yaml")
    if isinstance(r, Inventory):
        assert r.hosts
        for h in r.hosts:   # every accepted host is an identifier, every accepted value a single safe line
            assert inventory.HOSTNAME_RE.match(h.name)
            for v in (h.address, h.user, h.interface, h.proxy_jump):
                assert v is None or (v and not v.startswith("-") and not any(c.isspace() for c in v))
            assert h.port is None or 1 <= h.port <= 65535


@SETTINGS
@given(inventories, st.text(max_size=20))
def test_inventory_parse_file_only_clean_errors(tmp_path_factory, data, noise):
    text = _dump(data)
    if text is None:
        return
    path = tmp_path_factory.mktemp("inv") / "inv.yaml"
    # the dump as is, and a mangled copy (random text spliced in: malformed YAML, tabs, odd indentation)
    for body in (text, text[: len(text) // 2] + noise + text[len(text) // 2:]):
        path.write_text(body, encoding="utf-8")
        _clean(inventory.parse, str(path))


@settings(max_examples=150, deadline=None)
@given(st.text(max_size=200))
def test_inventory_parse_arbitrary_text(tmp_path_factory, text):
    path = tmp_path_factory.mktemp("inv") / "inv.yaml"
    path.write_bytes(text.encode("utf-8", "surrogatepass"))
    _clean(inventory.parse, str(path))


def test_inventory_unreadable_and_binary_files(tmp_path):
    for name, body in [("bin.yaml", b"\xff\xfe\x00garbage"), ("deep.yaml", b"[" * 5000), ("empty.yaml", b""),
                       ("alias.yaml", b"a: &a [*a]\n")]:
        p = tmp_path / name
        p.write_bytes(body)
        assert isinstance(_clean(inventory.parse, str(p)), InputError), name
    assert isinstance(_clean(inventory.parse, str(tmp_path / "missing.yaml")), InputError)
    assert isinstance(_clean(inventory.parse, str(tmp_path)), InputError)   # a directory


# --------------------------------------------------------------------------------------------- job file
@SETTINGS
@given(jobs(), st.text(max_size=20))
def test_loads_job_only_clean_errors(data, noise):
    text = _dump(data)
    if text is None:
        return
    for body in (text, noise + text, text[: len(text) // 2] + noise + text[len(text) // 2:]):
        r = _clean(loads_job, body, "job.yaml")
        if isinstance(r, JobSpec):
            assert re.fullmatch(r"[a-z0-9][a-z0-9-]{0,62}", r.name)
            assert all(re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", k) for k in [*r.env, *r.secret_env])
            assert r.script is None or not r.script.startswith("-")


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=300))
def test_loads_job_arbitrary_text(text):
    _clean(loads_job, text, "job.yaml")


@pytest.mark.parametrize("text", ["[" * 5000, "{a: " * 3000, "a: &a [*a, *a]\n", "x: !!python/object:os.system ls\n",
                                  "name: a\nname: b\n", "\x00", "name: j\nscript: /t.py\nenv: {1: x}\n",
                                  "name: j\nscript: /t.py\nargs: [[1]]\n", "? [a]\n: b\n"])
def test_loads_job_pathological(text):
    assert isinstance(_clean(loads_job, text, "job.yaml"), InputError)



# --------------------------------------------------------------------------------------------- alias fan-out
def _list_bomb(levels: int, fan: int = 10) -> str:
    """``levels`` lists of ``fan`` aliases of the previous one: fan**levels leaves from a few hundred bytes."""
    out = ["l0: &l0 [" + ", ".join(['"x"'] * fan) + "]"]
    out += [f"l{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * fan) + "]" for i in range(1, levels)]
    return "\n".join(out) + "\n"


def _group_dag(levels: int) -> str:
    """Inventory groups as a DAG of aliases: every group has two children that are the same group below it,
    2**levels paths to the bottom."""
    defs = "".join(f"  d{i}: &g{i} {{children: {{a{i}: *g{i - 1}, b{i}: *g{i - 1}}}}}\n" for i in range(1, levels + 1))
    return ("all:\n  vars: {}\n  hosts: {h0: }\n  children:\n    top: *g%d\n" % levels).replace(
        "all:\n", "x:\n  children:\n    d0: &g0 {hosts: {h1: }}\n" + defs.replace("  d", "    d") + "all:\n", 1)


@pytest.mark.parametrize("levels", [6, 9])
def test_job_alias_fan_out_is_linear(levels):
    """10**levels leaves (issue 11 item 6: 10**6 from 406 bytes took 0.44 s in _find_nul, 10**9 never ends)."""
    import time

    text = _list_bomb(levels) + "name: ok\nscript: /t.py\n"
    assert len(text) < 700
    t0 = time.monotonic()
    assert isinstance(_clean(loads_job, text, "job.yaml"), InputError)
    assert time.monotonic() - t0 < 0.5


def test_inventory_group_dag_is_bounded():
    """2**18 paths through aliased child groups from ~1 KB (4.4 s before), 2**30 would never end: a clean error."""
    import time

    for levels in (18, 30):
        text = _group_dag(levels)
        assert len(text) < 2500
        t0 = time.monotonic()
        e = _clean(inventory.parse_data, __import__("clusterctl.config.yamlfile", fromlist=["loads"]).loads(text, "inv.yaml"),
                   "inv.yaml")
        assert isinstance(e, InputError) and "group entries" in str(e), e
        assert time.monotonic() - t0 < 1.0


def test_inventory_small_group_dag_still_loads():
    """Aliases that repeat a group a few times are fine (and mean what they say)."""
    from clusterctl.config import yamlfile

    inv = inventory.parse_data(yamlfile.loads(_group_dag(3), "inv.yaml"), "inv.yaml")
    assert {h.name for h in inv.hosts} == {"h0", "h1"}


def test_host_range_bomb_is_refused():
    e = _clean(inventory.parse_data, {"all": {"hosts": {"n[0:99999][0:99999]": None}}}, "inv.yaml")
    assert isinstance(e, InputError) and "more than" in str(e)


# --------------------------------------------------------------------------------------------- issue 24 item 14
OLD_FLATTEN = '''
from yaml.constructor import SafeConstructor
from yaml.nodes import MappingNode, SequenceNode


def old_flatten(self, node):
    """PyYAML before merge-key dedup: every merged pair copied each time it is merged."""
    merge = []
    index = 0
    while index < len(node.value):
        key_node, value_node = node.value[index]
        if key_node.tag == "tag:yaml.org,2002:merge":
            del node.value[index]
            if isinstance(value_node, MappingNode):
                self.flatten_mapping(value_node)
                merge.extend(value_node.value)
            elif isinstance(value_node, SequenceNode):
                submerge = []
                for subnode in value_node.value:
                    self.flatten_mapping(subnode)
                    submerge.append(subnode.value)
                submerge.reverse()
                for value in submerge:
                    merge.extend(value)
        else:
            index += 1
    if merge:
        node.value = merge + node.value


SafeConstructor.flatten_mapping = old_flatten
'''


def merge_bomb(depth: int = 10, width: int = 9) -> str:
    level = "&l0 {k0: 0}"
    for i in range(1, depth + 1):
        level = f"&l{i} {{<<: [{level}{f', *l{i - 1}' * (width - 1)}]}}"
    return f"top: {{<<: {level}}}\n"


def test_a_merge_key_bomb_stays_small_whatever_the_pyyaml_version(tmp_path):
    """A ~600-byte document whose nested merges would expand to 9**10 pairs: loaded in a fresh interpreter
    that has PyYAML's old (no dedup) merge code, under a 1.5 GB memory limit. clusterctl's loader takes each merged
    key once: the document is ``{top: {k0: 0}}`` within a second."""
    import subprocess
    import sys

    text = merge_bomb()
    assert len(text) < 700
    (tmp_path / "bomb.yaml").write_text(text)
    (tmp_path / "oldyaml.py").write_text(OLD_FLATTEN)
    prog = ("import resource, sys, time; resource.setrlimit(resource.RLIMIT_AS, (1536 << 20, 1536 << 20))\n"
            f"sys.path.insert(0, {str(tmp_path)!r}); import oldyaml\n"
            "from clusterctl.config.yamlfile import load_yaml_with_lines\n"
            f"t = time.perf_counter(); d = load_yaml_with_lines({str(tmp_path / 'bomb.yaml')!r})\n"
            "print(time.perf_counter() - t); print(d)")
    try:
        p = subprocess.run([sys.executable, "-c", prog], capture_output=True, text=True, timeout=30)
    except subprocess.TimeoutExpired:
        pytest.fail("the merge bomb was still expanding after 30 s")
    assert p.returncode == 0, p.stderr[-2000:]
    seconds, data = p.stdout.splitlines()
    assert float(seconds) < 2 and data == "{'top': {'k0': 0}}"


def test_merge_keys_still_work_and_are_bounded(tmp_path):
    from clusterctl.config.yamlfile import MAX_MERGED_KEYS, loads

    assert loads("d: &d {a: 1, b: 2}\nx: {<<: *d, c: 3}\ny: {<<: [*d, {e: 5}]}\n", "f.yaml") == {
        "d": {"a": 1, "b": 2}, "x": {"a": 1, "b": 2, "c": 3}, "y": {"a": 1, "b": 2, "e": 5}}
    with pytest.raises(InputError, match="takes a mapping or a list of mappings"):
        loads("x: {<<: 3}\n", "f.yaml")
    many = "{" + ", ".join(f"k{i}: {i}" for i in range(MAX_MERGED_KEYS + 1)) + "}"
    with pytest.raises(InputError, match=f"more than {MAX_MERGED_KEYS} keys"):
        loads(f"x: {{<<: {many}}}\n", "f.yaml")
