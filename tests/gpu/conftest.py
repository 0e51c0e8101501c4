"""tests/gpu/ holds a manual check for a real GPU machine (run_gpu_checks.sh), not pytest tests: never collect."""
collect_ignore_glob = ["*"]
