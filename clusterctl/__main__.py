"""``python -m clusterctl``: the same CLI as the ``clusterctl`` command (useful before the venv is on PATH)."""
from clusterctl.cli import main

if __name__ == "__main__":
    main()
