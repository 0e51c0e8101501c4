"""A job that writes far more output than its controller's state dir holds (tests/integration/test_crash_windows.py:
the full disk), then exits 0. No torch import."""
import sys

line = "chatty " + "x" * 200 + "\n"
for i in range(int(sys.argv[1]) if len(sys.argv) > 1 else 60000):
    sys.stdout.write(f"{i:06d} {line}")
sys.stdout.flush()
print("chatty: done")
