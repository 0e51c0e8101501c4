"""The use cases: one module per command group, as ``cli/`` has them (``cli.lifecycle`` -> ``usecases.lifecycle``,
...), plus ``base`` (the workspace) and ``context`` (the job and its hosts before anything starts). A use case takes
a request (plain values) and its dependencies and returns an outcome value; none prints or exits."""
