"""What every transport's ``run`` must do with a command's output: keep the last ``MAX_OUTPUT`` bytes of each
stream, in bounded memory (used by the SSH-less transports' tests: srun, local)."""
from __future__ import annotations

import tracemalloc

from clusterctl.transport.base import MAX_OUTPUT


def assert_keeps_the_last_8_mib(transport, out_mb: int, err_mb: int) -> None:
    script = (f'head -c {out_mb}000000 /dev/zero | tr "\\0" x; echo; echo END-OF-OUT; '
              f'head -c {err_mb}000000 /dev/zero | tr "\\0" y >&2; echo >&2; echo END-OF-ERR >&2')
    tracemalloc.start()
    try:
        r = transport.run(["sh", "-c", script], timeout=120)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert r.ok, r.stderr[-200:]
    assert len(r.stdout) == MAX_OUTPUT and r.stdout.endswith("xxx\nEND-OF-OUT\n")
    assert len(r.stderr) == MAX_OUTPUT and r.stderr.endswith("yyy\nEND-OF-ERR\n")
    assert peak < 5 * MAX_OUTPUT, f"peak {peak / 2**20:.0f} MiB"       # the two tails and their decoded copies
