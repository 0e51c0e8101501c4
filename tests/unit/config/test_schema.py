"""The shipped JSON Schema (issue 39 item 9): it accepts the shipped template and what docs/job.md allows a job file
to write, refuses what load_job refuses for its shape, and describes every key (editors show it on hover)."""
import json
from pathlib import Path

import jsonschema
import pytest

from clusterctl.config import yamlfile
from clusterctl.config.spec import json_schema, load_job

REPO = Path(__file__).resolve().parents[3]
SHIPPED = json.loads((REPO / "templates" / "job.schema.json").read_text())


def as_editor_reads(text: str):
    """YAML 1.2 as yaml-language-server reads it (`on:` is a string key, as clusterctl's loader has it)."""
    return json.loads(json.dumps(yamlfile.loads(text, "job.yaml")))


def validator():
    jsonschema.Draft202012Validator.check_schema(SHIPPED)
    return jsonschema.Draft202012Validator(SHIPPED)


def test_the_shipped_schema_is_the_cli_one():
    assert SHIPPED == json.loads(json.dumps(json_schema()))


def test_the_shipped_template_is_valid_by_the_shipped_schema():
    data = as_editor_reads((REPO / "templates" / "job.yaml").read_text())
    errors = [f"{list(e.path)}: {e.message}" for e in validator().iter_errors(data)]
    assert errors == []
    load_job(str(REPO / "templates" / "job.yaml"))


@pytest.mark.parametrize("text", [
    "torchrun: torchrun",
    "torchrun: [python3, -m, torch.distributed.run]",
    "args: [--lr, 0.1, --epochs, 10]",
    "env: {OMP_NUM_THREADS: 4, LR: 3.0e-4, NCCL_DEBUG: WARN}",
    "container: {ulimits: {memlock: -1, stack: 67108864, nofile: '1024:4096'}}",
    "container: {shm_size: 16g, ipc: private}",
    "restarts: {window: 3600}",
    "restarts: {window: progress}",
    "nodes: '2:4'",
    "nproc_per_node: gpu",
    "notify: [{webhook_env: SLACK_URL, on: [failed, recovering]}, {command: [echo, hi]}]",
])
def test_what_the_docs_allow_a_job_file_to_write_is_valid_by_the_schema(tmp_path, text):
    path = tmp_path / "job.yaml"
    path.write_text(f"name: demo\nscript: train.py\n{text}\n")
    load_job(str(path))                                            # clusterctl accepts it ...
    data = as_editor_reads(path.read_text())
    assert [e.message for e in validator().iter_errors(data)] == []     # ... and so does the editor


@pytest.mark.parametrize("text", ["nodez: 2", "args: [[1]]", "torchrun: 5", "rendezvous: {port: x}",
                                  "container: {ulimits: {memlock: [1]}}", "recovery: lukewarm"])
def test_the_schema_still_refuses_a_wrong_shape(tmp_path, text):
    data = as_editor_reads(f"name: demo\nscript: train.py\n{text}\n")
    assert list(validator().iter_errors(data)), text


def test_every_key_has_a_description():
    def props(node, prefix=""):
        for key, prop in node.get("properties", {}).items():
            yield prefix + key, prop

    described = dict(props(SHIPPED))
    for name, definition in SHIPPED["$defs"].items():
        described.update({f"{name}.{k}": p for k, p in props(definition)})
    missing = [k for k, p in described.items() if not p.get("description")]
    assert missing == [] and len(described) > 50, missing
    assert SHIPPED["description"]
