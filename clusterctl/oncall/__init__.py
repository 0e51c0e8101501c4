"""Commands on a job's nodes: exec, shell, stacks, and where a job runs now."""
