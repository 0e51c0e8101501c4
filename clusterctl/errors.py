"""One exception tree. Every message here is written for the user who will read it.

Exit codes: ``UserError`` (bad input, usage) -> 2; any other ``ClusterctlError`` -> 1.
"""
from __future__ import annotations


class ClusterctlError(Exception):
    """Base of every error clusterctl reports to the user (no traceback unless --debug)."""

    exit_code = 1


class UserError(ClusterctlError):
    """Bad input or usage: exit code 2."""

    exit_code = 2


class InputError(UserError):
    """An error located in an input file: rendered as ``FILE:LINE: key: message``."""

    def __init__(self, file: str, line: int | None, message: str, key: str | None = None):
        self.file, self.line, self.key, self.message = file, line, key, message
        where = f"{file}:{line}" if line else file
        super().__init__(f"{where}: {key}: {message}" if key else f"{where}: {message}")


class InputErrors(InputError):
    """Several ``InputError``s at once (every problem of a file, not only the first), sorted by file and line;
    ``file``/``line``/``key``/``message`` are the first one's, the text is one line per problem."""

    def __init__(self, errors):
        self.errors = sorted(errors, key=lambda e: (e.file, e.line or 0))
        first = self.errors[0]
        self.file, self.line, self.key, self.message = first.file, first.line, first.key, first.message
        UserError.__init__(self, "\n".join(str(e) for e in self.errors))


def raise_all(errors) -> None:
    """Raise the one error, or ``InputErrors`` for several; nothing when there is none."""
    errors = list(errors)
    if len(errors) == 1:
        raise errors[0]
    if errors:
        raise InputErrors(errors)


class TransportError(ClusterctlError):
    """A remote operation on one host failed. ``host`` is the inventory name."""

    kind = "transport"
    transient = False

    def __init__(self, host: str, message: str):
        self.host, self.message = host, message
        super().__init__(f"{host}: {message}")


class ConnectError(TransportError):
    """TCP connect / SSH handshake failed or timed out: the only kind retried."""

    kind = "connect"
    transient = True


class AuthError(TransportError):
    kind = "auth"


class HostKeyError(TransportError):
    """Unknown or changed host key. Never retried, never accepted silently."""

    kind = "host_key"


class CommandTimeout(TransportError):
    kind = "timeout"


class DeadlineExceeded(TransportError):
    """The fan-out's per-host or overall deadline passed before the host answered."""

    kind = "deadline"
