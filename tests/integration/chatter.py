"""A torchrun entry point for log tests: every rank prints `tick 1` .. `tick N`, one every PERIOD seconds.

    chatter.py N PERIOD
"""
import os
import sys
import time

n, period = int(sys.argv[1]), float(sys.argv[2])
for k in range(1, n + 1):
    # one write per line: with PYTHONUNBUFFERED, print() writes the text and the newline separately, and torchrun's
    # --tee prefixes each piece it reads ("[4]:tick 57[4]:" on a loaded machine: a torn line in the node's own log)
    os.write(1, f"tick {k}\n".encode())
    time.sleep(period)
