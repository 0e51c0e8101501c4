"""``python -m clusterctl.cli``: the same as the ``clusterctl`` console script."""
from clusterctl.cli import main

main()
