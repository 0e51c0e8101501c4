"""``clusterctl exec``: one argv on many hosts, results as values, identical results grouped (as ``dshbak -c``).

Pure parts (``group``, ``render``, ``exit_code``) plus one thin function that fans the command out (``run``).
The argv is quoted by the transport (``shlex.join``): there is no shell unless the user writes ``sh -c``.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Callable, Sequence

from clusterctl.transport import ConnectOptions, Transport, fan_out

if TYPE_CHECKING:
    from clusterctl.config.inventory import Host

# bare `exec --job --in-container`: run in the job's directory on the host. $1 DIR, $2... the argv


@dataclass(frozen=True)
class ExecResult:
    host: str
    exit_code: int | None
    stdout: str
    stderr: str
    error: str | None          # the host could not run the command (unreachable, timeout, host key, auth)

    @property
    def ok(self) -> bool:
        return self.error is None and self.exit_code == 0

    def to_dict(self) -> dict:
        return asdict(self)


def run(hosts: Sequence["Host"], argv: Sequence[str], *, connect: Callable[["Host", ConnectOptions], Transport],
        options: ConnectOptions, timeout: float, wrap: Callable[["Host", list[str]], list[str]] | None = None,
        max_workers: int = 64) -> list[ExecResult]:
    """``argv`` on every host (at most ``max_workers`` at once), one result per host in input order.

    A host that cannot be reached is an ``error`` once its connect timeout has passed (``options.connect_timeout``);
    the fan-out's own deadline (connect timeout + command timeout + 2 s) bounds a host that hangs after that.
    ``wrap(host, argv)`` may turn the argv into the one that runs there (``podman exec NAME ...``)."""
    def one(h: "Host"):
        t = connect(h, options)
        try:
            return t.run(wrap(h, list(argv)) if wrap else list(argv), timeout=timeout)
        finally:
            t.close()

    results = fan_out(list(hosts), one, max_workers=max_workers,
                      host_timeout=options.connect_timeout + timeout + 2)
    out = []
    for r in results:
        if r.ok:
            out.append(ExecResult(r.host.name, r.value.exit_code, r.value.stdout, r.value.stderr, None))
        else:
            out.append(ExecResult(r.host.name, None, "", "", _message(r.host.name, r.error)))
    return out


def _message(host: str, e: BaseException) -> str:
    text = str(e) or e.__class__.__name__
    prefix = f"{host}: "
    return text[len(prefix):] if text.startswith(prefix) else text


def exit_code(results: Sequence[ExecResult]) -> int:
    """0 when every host exited 0, else 1."""
    return 0 if results and all(r.ok for r in results) else 1


def group(results: Sequence[ExecResult]) -> list[tuple[list[str], ExecResult]]:
    """Identical results (exit code, stdout, stderr, error) collapsed: [(hosts, result)], in order of first host."""
    groups: dict[tuple, tuple[list[str], ExecResult]] = {}
    for r in results:
        key = (r.exit_code, r.stdout, r.stderr, r.error)
        if key in groups:
            groups[key][0].append(r.host)
        else:
            groups[key] = ([r.host], r)
    return list(groups.values())


RULE = "-" * 16


def render(results: Sequence[ExecResult]) -> str:
    """``dshbak -c`` style: one block per distinct result, headed by the hosts that gave it."""
    blocks = []
    for hosts, r in group(results):
        status = f"error: {r.error}" if r.error else f"exit {r.exit_code}"
        lines = [RULE, f"{','.join(hosts)} ({len(hosts)} host{'s' if len(hosts) != 1 else ''}): {status}", RULE]
        if r.stdout:
            lines.append(r.stdout.rstrip("\n"))
        if r.stderr:
            lines += [f"[stderr] {ln}" for ln in r.stderr.rstrip("\n").splitlines()]
        blocks.append("\n".join(lines))
    ok = sum(1 for r in results if r.ok)
    summary = f"{ok}/{len(results)} host(s) exited 0"
    return "\n".join(blocks + [summary])
