"""``recovery: warm`` (the default), the controller's side: a zygote per node keeps torch imported, and a relaunch
whose node's zygote answers forks torchrun and its ranks from it (docs/design.md, "Warm recovery"). The first
attempt, and a node whose zygote does not answer, start cold and (re)start the zygote for the next relaunch; the
job's end removes the zygotes and warm dirs. The node side is ``launch/zygote.py`` and the runtimes' ``zygote_*``."""
from __future__ import annotations

import json
from pathlib import Path

from clusterctl.errors import TransportError
from clusterctl.launch import runtimes, zygote
from clusterctl.supervise.recovery import CHECKPOINT_INSTALLER, CommandFailed, NodeStart, what_failed

ZYGOTE_SOURCE = Path(zygote.__file__).read_bytes()   # written into each node's warm dir
WARM_DISABLED = "warm disabled: "      # runtimes.WARM_ROOT_SH's words when the node's warm root is not ours
WARM_PING_S = 5.0       # a survivor's zygote must answer within this, else its relaunch is cold


def zygote_stdin(plan_node) -> bytes:
    """What a zygote's start reads: the job's environment for the zygote as one JSON line (its plain variables: no
    secret, no ``CLUSTERCTL_*``, which name an attempt and by which a relaunch's cleanup finds the job's processes),
    then zygote.py (``zygote.with_job_env``: a warm rank sees what a cold one sees at its interpreter's start)."""
    env = {k: v for k, v in plan_node.env.items()
           if k not in plan_node.secret_names and not k.startswith("CLUSTERCTL_")}
    return json.dumps(env).encode() + b"\n" + ZYGOTE_SOURCE


class Warm:
    def start(self, n: NodeStart) -> tuple[str, str]:
        mode, why = warm_or_cold(n)
        if mode == "warm":   # the job's modules where the zygote's children see them too
            lib = n.runtime.warm_lib_dir(n.plan.warm_dir, n.attempt)
            prelude = f"{runtimes.LIB_DIR_VAR}={lib}\n{CHECKPOINT_INSTALLER}" if lib else CHECKPOINT_INSTALLER
            r = n.run(n.plan.warm_argv, timeout=n.timeout, stdin=n.plan.env_script(n.secrets, prelude))
            if r.ok:
                return mode, why
            failed = what_failed(r).splitlines()[-1]   # its zygote answered, then the warm start failed: cold, once
            n.run(n.runtime.remove_job_argv(n.job_id, jobs_root=n.jobs_root), timeout=n.timeout)
            why = f"its warm start failed ({failed[-200:]}): started cold"
        n.start_cold()
        # warm for the next relaunch (after this start: it goes first); not where the warm root is not ours
        if n.plan.zygote_argv and not why.startswith(WARM_DISABLED):
            why += start_zygote(n)
        return "cold", why

    def teardown(self, node, job_id, runtime, run) -> None:
        """The node's zygote container (or process) and its warm dir."""
        r = run(runtime.zygote_remove_argv(job_id, node, runtimes.warm_key(job_id, node)), timeout=60)
        if not r.ok:
            raise CommandFailed(r.stderr.strip()[-300:] or f"zygote: exit code {r.exit_code}")


def warm_or_cold(n: NodeStart) -> tuple[str, str]:
    """("warm", why) when the node's zygote answers (its relaunch is forked from it), else ("cold", why)."""
    if n.attempt <= 1:
        return "cold", "the job's first attempt"
    if not n.plan.warm_argv:
        return "cold", n.plan.cold_why
    try:
        r = n.run(n.runtime.zygote_ping_argv(n.plan.warm_dir), timeout=WARM_PING_S)
    except TransportError as e:
        return "cold", f"its zygote did not answer within {WARM_PING_S:g}s ({e})"
    if r.ok:
        return "warm", "its zygote answered: torchrun and the ranks are forked from it"
    text = what_failed(r).splitlines()[-1][-200:]
    if r.exit_code == 3 and WARM_DISABLED in text:   # the node's warm root is not this user's private dir
        return "cold", text[text.index(WARM_DISABLED):]    # (runtimes.WARM_ROOT_SH says why)
    if r.exit_code == 4 or "No such file" in text:
        return "cold", "no zygote on the node (a new node, or its zygote had not started yet)"
    return "cold", f"its zygote did not answer ({text})"


def start_zygote(n: NodeStart) -> str:
    """(Re)start the node's zygote container; returns "" or why it failed (the next relaunch is cold then)."""
    try:
        n.run(n.runtime.zygote_remove_argv(n.job_id, n.node, n.plan.warm_dir), timeout=n.timeout)
        r = n.run(n.plan.zygote_argv, timeout=n.timeout, stdin=zygote_stdin(n.plan))
    except TransportError as e:
        return f"; its zygote could not start: {e}"
    if not r.ok:
        return f"; its zygote could not start: {(r.stderr.strip() or f'exit code {r.exit_code}')[-200:]}"
    return ""


STRATEGY = Warm()
