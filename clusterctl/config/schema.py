"""The job file's JSON Schema as an editor uses it (yaml-language-server, VS Code): pydantic's schema of
``JobSpec`` with what a job file may *write* (``torchrun: torchrun``, ``args: [--lr, 0.1]``, ``ulimits: {memlock:
-1}``: the models turn them into strings before validating) and a description of every key (hover help; the first
sentence of its row in docs/job.md). Pure: a dict in, a dict out."""
from __future__ import annotations

import copy
from typing import Any

SCALAR = {"type": ["string", "number"]}                  # args items, env values: numbers become their text
ULIMIT = {"anyOf": [{"type": "integer"}, {"type": "string", "pattern": r"^(-1|[0-9]+)(:(-1|[0-9]+))?$"}]}
# where the job file may write more than the model stores: dotted key -> JSON Schema of what it accepts
INPUT_FORMS: dict[str, dict[str, Any]] = {
    "args": {"type": "array", "items": SCALAR},
    "env": {"type": "object", "additionalProperties": SCALAR},
    "torchrun": {"anyOf": [{"type": "string", "minLength": 1}, {"type": "array", "items": {"type": "string"},
                                                                   "minItems": 1}]},
    "container.ulimits": {"type": "object", "additionalProperties": ULIMIT},
    "container.shm_size": {"anyOf": [{"type": "string"}, {"type": "integer", "minimum": 1}, {"type": "null"}]},
    "restarts.window": {"anyOf": [{"type": "string"}, {"type": "number", "exclusiveMinimum": 0}]},
}

# the first sentence of each key's row in docs/job.md (tests/unit/config/test_schema.py keeps every key described)
DESCRIPTIONS: dict[str, str] = {
    "name": "Job name, [a-z0-9][a-z0-9-]{0,62}; part of the job id, which names containers and directories.",
    "image": "Container image (ignored by the bare runtime).",
    "nodes": "Node count N, or \"MIN:MAX\" (quoted) for elastic membership (torchrun --nnodes MIN:MAX).",
    "nproc_per_node": "Processes per node, or \"gpu\": the host's GPU count (clusterctl_gpus in the inventory).",
    "script": "Script run by torchrun, relative to workdir (or module: instead).",
    "module": "Python module run with torchrun -m (e.g. pkg.train), instead of script.",
    "args": "Arguments for the script/module, placed after it; numbers are passed as written (0.10 stays 0.10).",
    "workdir": "Working directory (absolute); null: the image's WORKDIR (containers) / the job file's directory "
               "(bare).",
    "env": "Environment for the training processes (numbers as written).",
    "secret_env": "Names whose values are copied from clusterctl's own environment at launch (never printed or "
                  "stored).",
    "mounts": "SRC:DST[:ro|rw] bind mounts, absolute paths (containers only).",
    "torchrun": "How to start torchrun on the node: a string (split like a shell would) or a list, e.g. [python3, "
                "-m, torch.distributed.run].",
    "rendezvous": "c10d rendezvous (torchrun --rdzv-backend c10d).",
    "rendezvous.port": "Port of the rendezvous store on the rendezvous host, 1..65535.",
    "rendezvous.host": "Inventory host that holds the rendezvous; null: the first chosen node.",
    "rendezvous.join_timeout": "Seconds to wait for nodes to join.",
    "rendezvous.last_call_timeout": "Seconds to wait for more nodes once MIN have joined.",
    "rendezvous.close_timeout": "Seconds to wait for the rendezvous to close.",
    "rendezvous.keep_alive_interval": "Seconds between agent heartbeats.",
    "rendezvous.keep_alive_max_attempt": "Missed heartbeats before a node is dropped from the rendezvous.",
    "rendezvous.read_timeout": "Seconds for one read from the rendezvous store.",
    "rendezvous.exposure_ok": "true: launch does not warn that the rendezvous port listens on addresses outside "
                              "the cluster network (firewalled, or a machine of your own).",
    "checkpoint": "Passed to the script as CLUSTERCTL_CHECKPOINT_* (see clusterctl.checkpoint).",
    "checkpoint.dir": "Shared checkpoint directory (absolute), e.g. /shared/ckpt/my-job.",
    "checkpoint.keep": "Complete checkpoints to keep (>= 1).",
    "checkpoint.verify": "How a checkpoint is verified before resuming from it: size or sha256.",
    "restarts": "Restart budgets.",
    "restarts.max_restarts": "torchrun --max-restarts: local worker-group restarts per node.",
    "restarts.max_failures": "Whole-job restarts allowed after a failure of the training code, within "
                             "restarts.window.",
    "restarts.max_node_failures": "Whole-job restarts allowed after a lost node (infrastructure), within "
                                  "restarts.window.",
    "restarts.window": "What a budget counts: the failures within this window (30s, 90m, 24h, 7d, 1w or seconds), "
                       "or progress: the failures since the last progress.",
    "restarts.progress_after_s": "An attempt made progress when it wrote a new valid checkpoint or ran with output "
                                 "for this many seconds.",
    "restarts.backoff_s": "First delay (s) before a whole-job restart; doubles with each failure without progress.",
    "restarts.backoff_max_s": "Longest delay (s) before a restart; must be >= backoff_s.",
    "supervisor": "Recovery settings.",
    "supervisor.probe_interval_s": "Seconds between health probes.",
    "supervisor.probe_failures": "Consecutive failed probes before a node is declared lost (at least 2).",
    "supervisor.hang_timeout_s": "Seconds without progress (log output or a new checkpoint) before an attempt is "
                                 "declared hung.",
    "supervisor.first_progress_timeout_s": "The hang bound until an attempt's first progress (a silent first step: "
                                           "compile, NCCL init).",
    "supervisor.start_timeout_s": "Bound (s) of each per-node command that starts an attempt.",
    "supervisor.slurm_drain": "Under Slurm: a cordon by the supervisor also drains the node (scontrol update ... "
                              "State=DRAIN).",
    "supervisor.cordon_after": "The supervisor cordons a host after this many infrastructure failures of it "
                               "(node_lost, rendezvous_lost, hang, gpu_error, straggler) within 24 h; 0: never.",
    "supervisor.stuck_timeout_s": "A rank stuck while its peers wait in a collective makes the attempt a hang once "
                                  "its last progress is this many seconds old; 0: off.",
    "supervisor.stragglers": "What a straggler (a rank every collective waits for) gets: warn (an event) or "
                             "relaunch (its node is replaced by a spare when one exists).",
    "supervisor.collective_timeout_s": "CLUSTERCTL_COLLECTIVE_TIMEOUT_S: the process-group timeout scripts should "
                                       "pass to init_process_group.",
    "container": "docker/podman settings (ignored by bare).",
    "container.ipc": "--ipc: host, private, shareable or none.",
    "container.shm_size": "--shm-size (e.g. 16g); refused with ipc: host.",
    "container.ulimits": "--ulimit NAME=VALUE each; value an integer (-1 = unlimited) or SOFT:HARD; {}: none.",
    "container.pids_limit": "--pids-limit of every container clusterctl starts; -1: unlimited; 0 is refused.",
    "container.extra_args": "Extra run arguments, each one argv element, placed just before the image.",
    "hosts": "Inventory hosts or groups to run on, in order; those beyond nodes' MAX are spares. null: the "
             "inventory's first MAX hosts, no spares (-i slurm: every allocated node, those beyond MAX spares).",
    "recovery": "How survivors of a fault are relaunched: warm (a zygote per node keeps torch imported) or cold.",
    "notify": "Notification targets: {webhook: URL}, {webhook_env: VAR} or {command: [ARGV...]}, each with on: "
              "[events].",
    "notify.webhook": "Webhook URL, https:// (http:// only with allow_http: true).",
    "notify.webhook_env": "Name of an environment variable of clusterctl holding the webhook URL (needed at launch).",
    "notify.command": "An argv run on the controller (no shell) with CLUSTERCTL_EVENT, CLUSTERCTL_STATE, ... in its "
                      "environment.",
    "notify.allow_http": "true: this entry's webhook may be plain http://.",
    "notify.on": "The events this target gets: started, recovering, failed, succeeded, stopped.",
}


def for_editors(schema: dict[str, Any]) -> dict[str, Any]:
    """``schema`` (pydantic's, of ``JobSpec``) with the job file's input forms and every key's description."""
    out = copy.deepcopy(schema)
    for dotted, description in DESCRIPTIONS.items():
        prop = _property(out, dotted)
        if prop is not None:
            prop["description"] = description
    for dotted, form in INPUT_FORMS.items():
        prop = _property(out, dotted)
        if prop is not None:
            kept = {k: v for k, v in prop.items() if k in ("default", "description", "title")}
            prop.clear()
            prop.update({**form, **kept})
    return out


def _property(schema: dict[str, Any], dotted: str) -> dict[str, Any] | None:
    """The property schema of a dotted key (``rendezvous.port``; ``notify.on``: a key of a list's items), through
    ``$ref``s into ``$defs``."""
    node: dict[str, Any] | None = schema
    for part in dotted.split("."):
        node = _target(schema, node)
        if node is None or part not in node.get("properties", {}):
            return None
        node = node["properties"][part]
    return node


def _target(schema: dict[str, Any], node: dict[str, Any]) -> dict[str, Any] | None:
    """The object schema ``node`` stands for: itself, its ``$ref``, its array's items, or an ``anyOf`` branch."""
    if "properties" in node:
        return node
    if "$ref" in node:
        return _target(schema, schema["$defs"][node["$ref"].rsplit("/", 1)[1]])
    if node.get("type") == "array" and isinstance(node.get("items"), dict):
        return _target(schema, node["items"])
    for branch in node.get("anyOf", []):
        found = _target(schema, branch)
        if found is not None:
            return found
    return None
