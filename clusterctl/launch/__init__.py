"""What starts on the nodes: the pure launch plan and the runtimes (docker, podman, bare)."""
