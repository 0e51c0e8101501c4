"""A training script that always fails: exits 1 at once, whatever its arguments (tests/integration/test_recovery.py,
the restart budget). The quickstart's ``--fail-always`` does the same after importing torch: 3 s of CPU per rank."""
raise SystemExit("fail.py: exiting with status 1")
