"""The job file: pydantic models (``extra="forbid"``) and ``load_job(path) -> JobSpec``.

Every problem is an ``InputError`` rendered ``FILE:LINE: key: message``; pydantic's error ``loc`` is mapped back
to the YAML line with ``line_of``. The spec only ever holds secret *names* (``secret_env``), never values.
Every key, its default and meaning: docs/job.md. A commented starting point: templates/job.yaml.
"""
from __future__ import annotations

import difflib
import os
import re
import shlex
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PrivateAttr,
    SecretStr,
    ValidationError,
    ValidationInfo,
    field_serializer,
    field_validator,
    model_validator,
)

from clusterctl.config import yamlfile
from clusterctl.config.ids import JOB_NAME_RE
from clusterctl.config.yamlfile import line_of
from clusterctl.errors import InputError, raise_all
from clusterctl.model import budget

ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
MODULE_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
NODES_RE = re.compile(r"^\s*([0-9]+)\s*(?::\s*([0-9]+)\s*)?$")
SHM_RE = re.compile(r"^[0-9]+[bkmgBKMG]?$")
ULIMIT_NAME_RE = re.compile(r"^[a-z]+$")
ULIMIT_VALUE_RE = re.compile(r"^-?[0-9]+(:-?[0-9]+)?$")
IMAGE_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/:@+-]*$")

# Set by clusterctl for every node (see plan.py); a job may not set them itself.
# the recovery strategies, the first the default: one registry line each, the job's `recovery:` choices; each is the
# module clusterctl/supervise/recovery/<name>.py (supervise.recovery.get finds it by its name)
RECOVERIES = ("warm", "cold")
RESERVED_ENV_PREFIX = "CLUSTERCTL_"
# Set by torchrun for every worker; setting them in the job breaks the rendezvous.
TORCHRUN_ENV = frozenset({
    "RANK", "LOCAL_RANK", "GROUP_RANK", "ROLE_RANK", "ROLE_NAME", "WORLD_SIZE", "LOCAL_WORLD_SIZE",
    "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS",
    "TORCHELASTIC_RUN_ID", "TORCHELASTIC_ERROR_FILE", "TORCHELASTIC_USE_AGENT_STORE",
})


def _single_line(v: str, what: str = "value") -> str:
    if "\n" in v or "\r" in v:
        raise ValueError(f"{what} must be a single line")
    return v


def _scalar_str(v: Any, what: str) -> str:
    """YAML scalars for args/env values: strings, and ints/floats turned into their text. Booleans are refused
    (YAML reads ``yes``/``on``/``true`` as booleans: quote them)."""
    if isinstance(v, bool):
        raise ValueError(f"{what} is a YAML boolean ({v}): quote it, e.g. \"{'true' if v else 'false'}\"")
    if isinstance(v, (int, float)):
        return str(v)
    if isinstance(v, str):
        return v
    raise ValueError(f"{what} must be a string, got {_kind(v)}")


def _numbers_as_written(data: dict) -> dict:
    """``args`` items and ``env`` values that YAML read as numbers, back to their text in the file."""
    args, env = data.get("args"), data.get("env")
    if isinstance(args, list):
        data["args"] = [yamlfile.number_text(args, i, v) for i, v in enumerate(args)]
    if isinstance(env, dict):
        data["env"] = {k: yamlfile.number_text(env, k, v) for k, v in env.items()}
    return data


def _kind(v: Any) -> str:
    if v is None:
        return "nothing (null)"
    if isinstance(v, dict):
        return "a mapping"
    if isinstance(v, list):
        return "a list"
    return f"{type(v).__name__} {v!r}"


def _abs_path(p: str, what: str) -> str:
    if not p.startswith("/"):
        raise ValueError(f"{what} must be an absolute path, got {p!r}")
    return _single_line(p, what)


def _arg(v: Any) -> str:
    return _scalar_str(v, "argument")


def _line_arg(v: Any) -> str:
    return _single_line(_scalar_str(v, "entry"), "entry")


def _env_value(v: Any) -> str:
    if v is None:
        raise ValueError("has no value (use \"\" for an empty value)")
    return _scalar_str(v, "value")


def _env_name(k: Any) -> str:
    if not isinstance(k, str) or not ENV_NAME_RE.match(k):
        raise ValueError(f"invalid environment variable name {k!r} (letters, digits, '_', not starting with a digit)")
    if k.startswith(RESERVED_ENV_PREFIX):
        raise ValueError(f"{k}: CLUSTERCTL_* variables are set by clusterctl")
    if k in TORCHRUN_ENV:
        raise ValueError(f"{k} is set by torchrun for every worker and must not be set by the job")
    return k


def _window(v: Any) -> str:
    """restarts.window: a duration (``config.durations``: ``24h``, ``90m``, ``7d``, ``1w``, seconds) or ``progress``."""
    budget.window_seconds(v)              # ValueError with the accepted forms
    return f"{v:g}s" if isinstance(v, (int, float)) else v.strip()


def _mount(m: Any) -> str:
    if not isinstance(m, str):
        raise ValueError(f"mount must be a string 'SRC:DST[:ro|rw]', got {_kind(m)}")
    parts = m.split(":")
    if len(parts) not in (2, 3) or (len(parts) == 3 and parts[2] not in ("ro", "rw")):
        raise ValueError(f"mount {m!r} must be 'SRC:DST' or 'SRC:DST:ro' / 'SRC:DST:rw'")
    for p in parts[:2]:
        if not p.startswith("/") or any(c in p for c in "\n\r,"):
            raise ValueError(f"mount {m!r}: {p!r} must be an absolute path (no commas or newlines)")
    return m


def _host_token(h: Any, what: str = "host or group name") -> str:
    """A host or group name as the job names it (resolved against the inventory later): a non-empty word that
    cannot pass for an option."""
    if not isinstance(h, str) or not h or h.startswith("-") or any(c.isspace() for c in h):
        raise ValueError(f"invalid {what} {h!r}")
    return h


def _ulimit_name(k: Any) -> str:
    if not isinstance(k, str) or not ULIMIT_NAME_RE.match(k):
        raise ValueError(f"invalid ulimit name {k!r} (lowercase letters, e.g. memlock)")
    return k


def _ulimit_value(v: Any) -> str:
    if isinstance(v, int) and not isinstance(v, bool):
        v = str(v)
    if not isinstance(v, str) or not ULIMIT_VALUE_RE.match(v):
        raise ValueError(f"must be an integer (-1 = unlimited) or 'SOFT:HARD', got {_kind(v)}")
    return v


Arg = Annotated[str, BeforeValidator(_arg)]
LineArg = Annotated[str, BeforeValidator(_line_arg)]
EnvName = Annotated[str, BeforeValidator(_env_name)]
EnvValue = Annotated[str, BeforeValidator(_env_value)]
Mount = Annotated[str, BeforeValidator(_mount)]
HostName = Annotated[str, BeforeValidator(_host_token)]
UlimitName = Annotated[str, BeforeValidator(_ulimit_name)]
UlimitValue = Annotated[str, BeforeValidator(_ulimit_value)]
Window = Annotated[str, BeforeValidator(_window)]


def visible_gpus(env: dict[str, str]) -> list[str] | None:
    """The GPUs a job's ``CUDA_VISIBLE_DEVICES`` lets its ranks see (indexes, UUIDs or MIG ids, as CUDA reads the
    list: up to the first invalid entry), or None when the job does not set it or hides every GPU ("" or "-1": a
    CPU job, never refused)."""
    value = env.get("CUDA_VISIBLE_DEVICES")
    if value is None or not value.strip() or value.strip().startswith("-"):
        return None
    out = []
    for item in value.split(","):
        item = item.strip()
        if not item or item.startswith("-"):
            break
        out.append(item)
    return out


def too_few_gpus(value: str, count: int, nproc: int, what: str) -> str:
    return (f"CUDA_VISIBLE_DEVICES={value!r} leaves {count} GPU(s) to each node but {what} starts {nproc} ranks: "
            "ranks would share a GPU or fail at torch.cuda.set_device(LOCAL_RANK); list at least as many GPUs as "
            "ranks, or lower nproc_per_node")


MAX_COUNT = 1_000_000        # a count of restarts, failures or probes: anything above it is a typo, not a budget
MAX_NPROC_PER_NODE = 256     # ranks per node: a CPU job may run more than one per GPU, never thousands


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, allow_inf_nan=False)


class Rendezvous(_Model):
    """c10d rendezvous; the timeouts go to torchrun's ``--rdzv-conf`` (seconds)."""

    port: int = Field(29400, ge=1, le=65535)
    host: str | None = None                 # inventory host name; default: the first chosen node
    join_timeout: int = Field(300, ge=1)
    last_call_timeout: int = Field(30, ge=1)
    close_timeout: int = Field(30, ge=1)
    keep_alive_interval: int = Field(5, ge=1)
    keep_alive_max_attempt: int = Field(3, ge=1)
    read_timeout: int = Field(60, ge=1)
    exposure_ok: bool = False               # true: launch does not warn that the port listens on every address

    @field_validator("host")
    @classmethod
    def _host(cls, v: str | None) -> str | None:
        return None if v is None else _host_token(v, "host name")


class Checkpoint(_Model):
    dir: str | None = None                  # shared directory; None: the script decides (CLUSTERCTL_CHECKPOINT_DIR="")
    keep: int = Field(3, ge=1)
    verify: Literal["size", "sha256"] = "size"

    @field_validator("dir")
    @classmethod
    def _dir(cls, v: str | None) -> str | None:
        return None if v is None else _abs_path(v, "checkpoint dir")


class Restarts(_Model):
    max_restarts: int = Field(3, ge=0, le=MAX_COUNT)   # torchrun --max-restarts (local worker-group restarts per node)
    max_failures: int = Field(3, ge=0, le=MAX_COUNT)   # job-level restarts after a user-code failure
    max_node_failures: int = Field(10, ge=0, le=MAX_COUNT)  # job-level restarts after a lost node (infrastructure)
    backoff_s: float = Field(1, ge=0)
    backoff_max_s: float = Field(30, ge=0)
    window: Window = "24h"                   # budgets count the failures within this window ("progress": since
                                             # the last attempt that made progress)
    progress_after_s: float = Field(600, gt=0)  # an attempt with output for this long made progress (as does a
                                                # new valid checkpoint): the backoff starts over

    @property
    def window_s(self) -> float | None:
        return budget.window_seconds(self.window)

    @field_validator("backoff_max_s")
    @classmethod
    def _order(cls, v: float, info: ValidationInfo) -> float:
        lo = info.data.get("backoff_s")
        if lo is not None and v < lo:
            raise ValueError(f"must be >= backoff_s ({lo:g}), got {v:g}")
        return v


class SupervisorSettings(_Model):
    probe_interval_s: float = Field(1, gt=0)
    probe_failures: int = Field(2, ge=2, le=MAX_COUNT)     # consecutive failed probes before a node is declared lost (one is noise)
    hang_timeout_s: float = Field(300, gt=0)  # no progress for this long -> the attempt is hung
    first_progress_timeout_s: float = Field(1800, gt=0)  # the hang bound until an attempt's first progress
    start_timeout_s: float = Field(60, gt=0)  # bound of each per-node command of a start (leftovers' removal, start)
    collective_timeout_s: int = Field(120, ge=1)  # -> CLUSTERCTL_COLLECTIVE_TIMEOUT_S (process-group timeout)
    cordon_after: int = Field(3, ge=0, le=MAX_COUNT)       # infrastructure failures of one host in 24 h before it is cordoned; 0: never
    slurm_drain: bool = False                # under Slurm: a cordon also drains the node (scontrol ... State=DRAIN)
    stuck_timeout_s: float = Field(20, ge=0)  # a stuck rank (model.ranks) this long without progress -> hang; 0: off
    stragglers: Literal["warn", "relaunch"] = "warn"  # relaunch: a straggler's node is replaced by a spare


NOTIFY_EVENTS = ("started", "recovering", "failed", "succeeded", "stopped")
WEBHOOK_RE = re.compile(r"^https?://[^\s/]+\S*$")
# A stored spec (the state DB) holds this instead of a webhook URL; the supervisor reads the URL from the job file.
STORED_WEBHOOK = "***"


def webhook_problem(url: str, allow_http: bool) -> str | None:
    """Why a webhook URL is refused (never quoting it: it is a secret), or None. https:// only, unless the notify
    entry sets ``allow_http: true`` (issue 24: the payload and the URL's token would cross the network in clear)."""
    if not WEBHOOK_RE.match(url):
        return "must be an https:// URL (the value is a secret and is not shown)"
    if url[:8].lower() != "https://" and not allow_http:
        return ("is a plain http:// URL: use https://, or set `allow_http: true` on this notify entry to send "
                "the payload (and the URL's token) unencrypted")
    return None


class NotifyTarget(_Model):
    """One ``notify:`` entry: exactly one of ``webhook`` (a secret: never printed or stored), ``webhook_env`` (the
    URL read from clusterctl's environment) or ``command`` (an argv run on the controller); ``on``: the events."""

    webhook: SecretStr | None = None
    webhook_env: EnvName | None = None
    command: list[Arg] | None = None
    on: list[Literal["started", "recovering", "failed", "succeeded", "stopped"]] = Field(
        default_factory=lambda: ["failed", "recovering"])
    allow_http: bool = False      # a webhook may be plain http:// (default: https:// only)

    @field_validator("webhook")
    @classmethod
    def _webhook(cls, v: SecretStr | None) -> SecretStr | None:
        if v is not None and v.get_secret_value() != STORED_WEBHOOK and not WEBHOOK_RE.match(v.get_secret_value()):
            raise ValueError("must be an http:// or https:// URL (the value is a secret and is not shown)")
        return v

    @field_serializer("webhook")
    def _dump_webhook(self, v: SecretStr | None) -> str | None:
        return None if v is None else STORED_WEBHOOK

    @field_validator("command")
    @classmethod
    def _command(cls, v: list[str] | None) -> list[str] | None:
        if v is not None and (not v or not v[0]):
            raise ValueError("must be a non-empty argv list, e.g. [/usr/local/bin/page, --team, ml]")
        return v

    @field_validator("on")
    @classmethod
    def _on(cls, v: list[str]) -> list[str]:
        if not v:
            raise ValueError(f"must name at least one event: {', '.join(NOTIFY_EVENTS)}")
        dup = sorted({e for e in v if v.count(e) > 1})
        if dup:
            raise ValueError(f"{', '.join(dup)} listed more than once")
        return v

    @model_validator(mode="after")
    def _one(self) -> "NotifyTarget":
        given = [k for k in ("webhook", "webhook_env", "command") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError("each notify entry needs exactly one of webhook, webhook_env or command"
                             + (f" (got {', '.join(given)})" if given else ""))
        url = self.webhook.get_secret_value() if self.webhook is not None else None
        if url is not None and url != STORED_WEBHOOK and webhook_problem(url, self.allow_http):
            raise ValueError(f"webhook: {webhook_problem(url, self.allow_http)}")
        return self

    def describe(self) -> str:
        """For the plan and logs: the webhook URL as ***."""
        what = ("webhook ***" if self.webhook is not None else f"webhook from ${self.webhook_env}"
                if self.webhook_env else f"command {shlex.join(self.command or [])}")
        return f"{what} on {','.join(self.on)}"


class Container(_Model):
    ipc: Literal["host", "private", "shareable", "none"] = "host"
    shm_size: str | None = None
    ulimits: dict[UlimitName, UlimitValue] = Field(default_factory=lambda: {"memlock": "-1", "stack": "67108864"})
    pids_limit: int = Field(-1, ge=-1)      # --pids-limit of every container (-1: unlimited; podman's 2048 is too few)
    extra_args: list[LineArg] = Field(default_factory=list)

    @field_validator("shm_size", mode="before")
    @classmethod
    def _shm(cls, v: Any) -> Any:
        if v is None:
            return None
        if isinstance(v, int) and not isinstance(v, bool) and v > 0:
            return str(v)
        if isinstance(v, str) and SHM_RE.match(v):
            return v
        raise ValueError(f"must be a size like 16g, 512m or a byte count, got {_kind(v)}")

    @field_validator("pids_limit")
    @classmethod
    def _pids(cls, v: int) -> int:
        if v == 0:
            raise ValueError("must be -1 (unlimited) or a number of processes and threads >= 1, got 0")
        return v

    @field_validator("shm_size")
    @classmethod
    def _shm_ipc(cls, v: str | None, info: ValidationInfo) -> str | None:
        if v is not None and info.data.get("ipc") == "host":
            raise ValueError("cannot be set with ipc: host (the host's /dev/shm is used); "
                             "remove shm_size or set ipc: private")
        return v


class JobSpec(_Model):
    name: str
    image: str = "pytorch-cuda:v2.7-ssh"
    nodes: int | str = 1
    nproc_per_node: int | str = 1
    script: str | None = None
    module: str | None = None
    args: list[Arg] = Field(default_factory=list)
    workdir: str | None = None
    env: dict[EnvName, EnvValue] = Field(default_factory=dict)
    secret_env: list[EnvName] = Field(default_factory=list)
    mounts: list[Mount] = Field(default_factory=list)
    torchrun: list[LineArg] = Field(default_factory=lambda: ["torchrun"])
    rendezvous: Rendezvous = Field(default_factory=Rendezvous)
    checkpoint: Checkpoint = Field(default_factory=Checkpoint)
    restarts: Restarts = Field(default_factory=Restarts)
    supervisor: SupervisorSettings = Field(default_factory=SupervisorSettings)
    container: Container = Field(default_factory=Container)
    hosts: list[HostName] | None = None
    notify: list[NotifyTarget] = Field(default_factory=list)
    recovery: Literal[RECOVERIES] = RECOVERIES[0]   # warm: survivors keep a warm zygote (docs/design.md, warm recovery)

    _source: str = PrivateAttr(default="")

    # -------------------------------------------------------------- derived values
    @property
    def source(self) -> str:
        """The job file this spec was loaded from ('' when built in code)."""
        return self._source

    @property
    def source_dir(self) -> str:
        """Absolute directory of the job file (the bare runtime's default workdir)."""
        return os.path.dirname(os.path.abspath(self._source)) if self._source else os.getcwd()

    @property
    def min_nodes(self) -> int:
        return self.nodes if isinstance(self.nodes, int) else int(self.nodes.split(":")[0])

    @property
    def max_nodes(self) -> int:
        return self.nodes if isinstance(self.nodes, int) else int(self.nodes.split(":")[1])

    @property
    def elastic(self) -> bool:
        return self.min_nodes != self.max_nodes

    # -------------------------------------------------------------- validators
    @field_validator("name", mode="before")
    @classmethod
    def _name(cls, v: Any) -> Any:
        if not isinstance(v, str):
            raise ValueError(f"must be a string, got {_kind(v)}")
        if "/" in v:
            raise ValueError(f"job name {v!r} must not contain '/': it names containers and directories")
        if not JOB_NAME_RE.match(v):
            raise ValueError(f"invalid job name {v!r}: lowercase letters, digits and '-', "
                             "starting with a letter or digit, at most 63 characters")
        return v

    @field_validator("image")
    @classmethod
    def _image(cls, v: str) -> str:
        if not IMAGE_RE.match(v):
            raise ValueError(f"invalid image reference {v!r}")
        return v

    @field_validator("nodes", mode="before")
    @classmethod
    def _nodes(cls, v: Any) -> Any:
        if isinstance(v, int) and not isinstance(v, bool):
            if v < 1:
                raise ValueError(f"must be >= 1, got {v}")
            return v
        if isinstance(v, str):
            m = NODES_RE.match(v)
            if m:
                lo, hi = int(m.group(1)), int(m.group(2) if m.group(2) is not None else m.group(1))
                if lo < 1:
                    raise ValueError(f"minimum node count must be >= 1, got {v!r}")
                if lo > hi:
                    raise ValueError(f"MIN must be <= MAX in 'MIN:MAX', got {v!r}")
                return lo if lo == hi else f"{lo}:{hi}"
        raise ValueError(f"must be a node count (4) or an elastic range 'MIN:MAX' (\"2:4\"), got {_kind(v)}")

    @field_validator("nproc_per_node", mode="before")
    @classmethod
    def _nproc(cls, v: Any) -> Any:
        if isinstance(v, int) and not isinstance(v, bool) and 1 <= v <= MAX_NPROC_PER_NODE:
            return v
        if v == "gpu":
            return v
        raise ValueError(f"must be a process count 1..{MAX_NPROC_PER_NODE} or \"gpu\" (one per GPU), got {_kind(v)}")

    @field_validator("script")
    @classmethod
    def _script(cls, v: str | None) -> str | None:
        if v is None:
            return v
        if not v.strip():
            raise ValueError("must not be empty")
        if v.startswith("-"):
            raise ValueError(f"must not start with '-' (torchrun would read it as an option): use ./{v}")
        return _single_line(v, "script")

    @field_validator("module")
    @classmethod
    def _module(cls, v: str | None) -> str | None:
        if v is not None and not MODULE_RE.match(v):
            raise ValueError(f"invalid Python module name {v!r} (e.g. pkg.train)")
        return v

    @field_validator("workdir")
    @classmethod
    def _workdir(cls, v: str | None) -> str | None:
        return None if v is None else _abs_path(v, "workdir")

    @field_validator("secret_env")
    @classmethod
    def _secret_env(cls, v: list[str]) -> list[str]:
        dup = sorted({k for k in v if v.count(k) > 1})
        if dup:
            raise ValueError(f"{', '.join(dup)} listed more than once")
        return v

    @field_validator("torchrun", mode="before")
    @classmethod
    def _torchrun(cls, v: Any) -> Any:
        if isinstance(v, str):
            try:
                v = shlex.split(v)
            except ValueError as e:
                raise ValueError(f"cannot split {v!r}: {e}") from None
        if not isinstance(v, list) or not v:
            raise ValueError("must be a command (string or list), e.g. torchrun or "
                             f"[python3, -m, torch.distributed.run], got {_kind(v)}")
        if not isinstance(v[0], str) or not v[0] or v[0].startswith("-"):
            raise ValueError(f"must start with a program name, got {v[0]!r}")
        return v

    @field_validator("env")
    @classmethod
    def _visible_gpus(cls, v: dict[str, str], info: ValidationInfo) -> dict[str, str]:
        n, devices = info.data.get("nproc_per_node"), visible_gpus(v)
        if isinstance(n, int) and devices is not None and len(devices) < n:
            raise ValueError(too_few_gpus(v["CUDA_VISIBLE_DEVICES"], len(devices), n, "nproc_per_node"))
        return v

    @field_validator("hosts")
    @classmethod
    def _hosts(cls, v: list[str] | None) -> list[str] | None:
        if v is not None and not v:
            raise ValueError("must not be empty (leave it out to use the whole inventory)")
        return v

    @model_validator(mode="after")
    def _whole(self) -> "JobSpec":
        if (self.script is None) == (self.module is None):
            raise ValueError("exactly one of 'script' (a file run by torchrun) or 'module' (torchrun -m) is required")
        overlap = sorted(set(self.env) & set(self.secret_env))
        if overlap:
            raise ValueError(f"{', '.join(overlap)} is in both env and secret_env")
        return self


# ------------------------------------------------------------------ loading and error mapping

_MESSAGES = {
    "int_type": "must be an integer",
    "float_type": "must be a number",
    "string_type": "must be a string",
    "bool_type": "must be true or false",
    "list_type": "must be a list",
    "dict_type": "must be a mapping",
    "model_type": "must be a mapping",
}
_BOUNDS = {"greater_than": ">", "greater_than_equal": ">=", "less_than": "<", "less_than_equal": "<="}


def _fields_of(loc: tuple) -> tuple[str, ...]:
    """Known keys of the model that owns the last element of ``loc``."""
    model: Any = JobSpec
    for part in loc[:-1]:
        if not (isinstance(model, type) and issubclass(model, BaseModel)) or part not in model.model_fields:
            return ()
        model = model.model_fields[part].annotation
    return tuple(model.model_fields) if isinstance(model, type) and issubclass(model, BaseModel) else ()


def _locate(data: Any, loc: tuple) -> int | None:
    """Line of the deepest key of ``loc`` present in the raw YAML (the enclosing mapping's line otherwise)."""
    node, line = data, line_of(data)
    for part in loc:
        if isinstance(node, dict) and part in node:
            line = line_of(node, part)
        elif isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node):
            line = line_of(node, part)
        else:
            break
        node = node[part]
    return line


def _dotted(loc: tuple) -> str | None:
    out = ""
    for p in loc:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out or None


def _message(err: dict) -> str:
    t, ctx = err["type"], err.get("ctx") or {}
    if t == "extra_forbidden":
        key = err["loc"][-1]
        hint = difflib.get_close_matches(str(key), _fields_of(err["loc"]), 1)
        return f"unknown key {key!r}" + (f" (did you mean {hint[0]!r}?)" if hint else "")
    if t == "missing":
        return "required key is missing"
    if t == "value_error":
        return str(ctx.get("error", err["msg"]))
    if t == "literal_error":
        return f"must be one of {ctx.get('expected')}, got {_kind(err['input'])}"
    if t in _BOUNDS:
        bound = next(iter(ctx.values()), "?")
        return f"must be {_BOUNDS[t]} {bound}, got {err['input']!r}"
    if t == "finite_number":
        return f"must be a finite number, got {err['input']!r}"
    if t in _MESSAGES:
        return f"{_MESSAGES[t]}, got {_kind(err['input'])}" + _number_hint(t, err["input"])
    return str(err["msg"])


def _number_hint(t: str, value: Any) -> str:
    """YAML 1.1 reads ``1e300`` (no dot) as text: say what to write instead."""
    if t not in ("int_type", "float_type") or not isinstance(value, str) or not yamlfile.EXPONENT_TEXT.match(value):
        return ""
    if t == "int_type":
        number = float(value)
        return f" (YAML reads {value} as text: write {int(number)})" if number.is_integer() and abs(number) < 1e15 \
            else f" (YAML reads {value} as text: write the integer in digits)"
    mantissa, e, exponent = value.partition("e") if "e" in value else value.partition("E")
    return f" (YAML reads {value} as text: write {mantissa if '.' in mantissa else mantissa + '.0'}{e}{exponent})"


def _find_nul(node: Any, path: tuple = (), seen: set[int] | None = None) -> tuple | None:
    """The path to the first NUL in a key or string. Each mapping/list is walked once, however many YAML aliases
    refer to it: an alias fan-out (10 levels of 10 aliases = 10^10 leaves in a few hundred bytes) stays linear."""
    if isinstance(node, str):
        return path if "\x00" in node else None
    if not isinstance(node, (dict, list)):
        return None
    seen = set() if seen is None else seen
    if id(node) in seen:
        return None          # walked already (and held no NUL)
    seen.add(id(node))
    if isinstance(node, dict):
        for k, v in node.items():
            if isinstance(k, str) and "\x00" in k:
                return path + (k,)
            p = _find_nul(v, path + (k,), seen)
            if p is not None:
                return p
    else:
        for i, v in enumerate(node):
            p = _find_nul(v, path + (i,), seen)
            if p is not None:
                return p
    return None


def _real_key(part: Any) -> bool:
    """pydantic puts ``[key]`` (a bad dict key) and validator/union names in ``loc``; they are not YAML keys."""
    return not (isinstance(part, str) and (part == "[key]" or part.startswith(("function-", "union[", "nullable["))))


def parse_job(data: Any, file: str) -> JobSpec:
    """Validate loaded YAML data (``LineDict``/``LineList`` carry the lines for errors)."""
    if data is None:
        raise InputError(file, None, "job file is empty: expected a mapping with at least 'name' and 'script'")
    if not isinstance(data, dict):
        raise InputError(file, line_of(data) or 1,
                         f"job file must be a mapping of keys (name:, script:, ...), got {_kind(data)}")
    if "all" in data and not ({"name", "script", "module"} & set(data)):
        raise InputError(file, None, "this looks like an inventory (it has `all:`), not a job file: "
                                     "`clusterctl launch JOB.yaml -i INVENTORY.yaml` (the job first, the inventory "
                                     "after -i)")
    for k in data:
        if not isinstance(k, str):
            raise InputError(file, line_of(data, k), f"key must be a string, got {_kind(k)}")
    nul = _find_nul(data)
    if nul is not None:
        raise InputError(file, _locate(data, nul), "NUL byte in value", key=_dotted(nul))
    try:
        spec = JobSpec.model_validate(_numbers_as_written(dict(data)))
    except ValidationError as e:      # every problem of the file at once, in line order
        problems: dict[tuple, InputError] = {}
        flags = getattr(data, "overrides", {})      # `launch --nodes/--name/--env`: the error names the flag
        for err in e.errors(include_url=False):
            loc = tuple(p for p in err["loc"] if _real_key(p))
            flag = flags.get(loc[:1]) or flags.get(loc[:2])
            problems.setdefault(loc, InputError(flag, None, _message(err)) if flag else
                                InputError(file, _locate(data, loc), _message(err), key=_dotted(loc)))
        raise_all(sorted(problems.values(), key=lambda x: x.line or 0))
    except RecursionError:
        raise InputError(file, None, "nested too deeply") from None
    spec._source = file
    return spec


def loads_job(text: str, file: str = "<job>") -> JobSpec:
    """Parse and validate job YAML text; ``file`` is the name used in errors."""
    return parse_job(yamlfile.loads(text, file), file)


def load_job(path: str) -> JobSpec:
    """Read and validate a job file. Raises ``InputError`` (``FILE:LINE: key: message``) for every problem."""
    return parse_job(yamlfile.load_yaml_with_lines(path), path)


def json_schema() -> dict:
    """The job file's JSON Schema, from the pydantic models with what a file may write and a description of every
    key (``config.schema.for_editors``; ``clusterctl schema``; shipped as ``templates/job.schema.json``, kept equal
    by a test that also validates the template with it)."""
    from clusterctl.config.schema import for_editors

    schema = for_editors(JobSpec.model_json_schema(mode="validation"))
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "clusterctl job file"
    schema["description"] = "A clusterctl job: what to run, on how many nodes, and how to recover (docs/job.md)."
    return schema
