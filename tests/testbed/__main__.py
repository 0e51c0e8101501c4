"""Testbed CLI for humans and benchmarks.

    python -m tests.testbed up --hosts 4 --dir /tmp/tb [--prefix tb --subnet 77] [--gpus 8] [--no-image]
                               [--runtime podman|docker|bare]
    python -m tests.testbed status --dir /tmp/tb
    python -m tests.testbed partition|heal|kill|stop-sshd|start-sshd --dir /tmp/tb node2
    python -m tests.testbed down --dir /tmp/tb

``up`` leaves the testbed running and prints the inventory path; its state is ``<dir>/testbed.json``.
"""

from __future__ import annotations

import argparse
import sys
import time

from .core import Testbed
from .stubs import profile


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.testbed")
    sub = ap.add_subparsers(dest="cmd", required=True)
    up = sub.add_parser("up", help="build a testbed and leave it running")
    up.add_argument("--hosts", type=int, required=True)
    up.add_argument("--dir", required=True)
    up.add_argument("--prefix", default="tb")
    up.add_argument("--subnet", type=int, default=77)
    up.add_argument("--gpus", type=int, default=8)
    up.add_argument("--runtime", default="podman", choices=["podman", "docker", "bare"],
                    help="the inventory's runtime; docker: a real dockerd per host as well")
    up.add_argument("--no-image", action="store_true", help="leave hosts without the test image (faster)")
    for name in ("down", "status"):
        sub.add_parser(name).add_argument("--dir", required=True)
    for name in ("partition", "heal", "kill", "stop-sshd", "start-sshd"):
        p = sub.add_parser(name)
        p.add_argument("--dir", required=True)
        p.add_argument("host")
        if name == "kill":
            p.add_argument("--pattern", default=None, help="regex on /proc/PID/cmdline; default: everything")
            p.add_argument("--signal", type=int, default=9)
    args = ap.parse_args(argv)

    if args.cmd == "up":
        t0 = time.monotonic()
        prof = profile(gpus=args.gpus, image=not args.no_image)
        tb = Testbed(args.hosts, args.dir, [prof] * args.hosts, prefix=args.prefix, subnet_octet=args.subnet,
                     docker=args.runtime == "docker")
        tb.up()
        inv = tb.inventory(tb.base_dir / "inventory.yaml", runtime=args.runtime)
        print(f"testbed {args.prefix}: {args.hosts} hosts up in {time.monotonic() - t0:.1f}s", file=sys.stderr)
        print(inv)
        return 0
    tb = Testbed.load(args.dir)
    if args.cmd == "down":
        t0 = time.monotonic()
        tb.down()
        print(f"testbed {tb.prefix}: down in {time.monotonic() - t0:.1f}s", file=sys.stderr)
    elif args.cmd == "status":
        for h in tb.hosts:
            sshd = "sshd up" if tb.sshd_pid(h) else "sshd DOWN"
            link = "partitioned" if tb.partitioned(h) else "linked"
            print(f"{h.name}\t{h.address}\t{h.ns}\t{link}\t{sshd}\t{len(tb.processes(h))} processes")
    elif args.cmd == "partition":
        tb.partition(args.host)
    elif args.cmd == "heal":
        tb.heal(args.host)
    elif args.cmd == "kill":
        print(" ".join(map(str, tb.kill(args.host, args.pattern, args.signal))))
    elif args.cmd == "stop-sshd":
        tb.stop_sshd(args.host)
    elif args.cmd == "start-sshd":
        tb.start_sshd(args.host)
    return 0


if __name__ == "__main__":
    sys.exit(main())
