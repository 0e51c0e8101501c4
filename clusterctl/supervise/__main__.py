"""``python -m clusterctl.supervise [--state-dir DIR] JOB_ID [--adopt]``: the detached supervisor of one job.

``supervise.controller.spawn_supervisor`` starts it (own session, output to the job's supervisor.log). The command
line of the release before, ``clusterctl --state-dir DIR _supervise JOB_ID``, runs the same body (cli); both are
recognised as a job's supervisor (``controller.live_supervisor``). Exit 0 when the job succeeded, else 1; 2 and
the error's text for a user error (as the CLI).
"""
from __future__ import annotations

import argparse
import logging
import os
import sys


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m clusterctl.supervise")
    p.add_argument("--state-dir", default=os.environ.get("CLUSTERCTL_STATE_DIR"))
    p.add_argument("--debug", action="store_true")
    p.add_argument("job_id")
    p.add_argument("--adopt", action="store_true")
    args = p.parse_args(argv)
    # paramiko logs a failed handshake with its traceback; the failure reaches the job's events as a value
    logging.getLogger("paramiko").setLevel(logging.DEBUG if args.debug else logging.CRITICAL + 1)
    from clusterctl.errors import ClusterctlError
    from clusterctl.store import paths
    from clusterctl.store.state import JobState
    from clusterctl.supervise import controller
    from clusterctl.transport import ConnectOptions

    try:
        # never accept new host keys (issue 11): launch/resume recorded them before the supervisor started
        state = controller.supervise(paths.state_dir(args.state_dir), args.job_id,
                                     ConnectOptions(accept_new_host_keys=False), adopt=args.adopt,
                                     echo=lambda m: print(m, flush=True))
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr, flush=True)
        return 130
    except ClusterctlError as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
        return e.exit_code
    except Exception as e:  # noqa: BLE001 - as the CLI: one line, the traceback only with --debug
        if args.debug:
            import traceback

            traceback.print_exc()
        print(f"internal error: {e.__class__.__name__}: {e}", file=sys.stderr, flush=True)
        return 1
    return 0 if state == JobState.SUCCEEDED else 1


if __name__ == "__main__":
    sys.exit(main())
