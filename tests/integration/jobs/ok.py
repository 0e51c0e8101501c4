"""A training script that succeeds at once, whatever its arguments, without importing torch
(tests/integration/test_crash_windows.py: a kill right after success)."""
print("ok.py: done")
