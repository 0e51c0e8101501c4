"""A torchrun entry point for log tests: every rank prints `tick 1` .. `tick N`, one every PERIOD seconds.

    chatter.py N PERIOD
"""
import sys
import time

n, period = int(sys.argv[1]), float(sys.argv[2])
for k in range(1, n + 1):
    print(f"tick {k}", flush=True)
    time.sleep(period)
