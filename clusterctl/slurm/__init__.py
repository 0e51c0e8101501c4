"""Slurm: the allocation as hosts (``-i slurm``) and node health (drain), and the ``sbatch`` script."""
