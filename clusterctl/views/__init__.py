"""What the read-only commands show: status, history, nodes, logs, 80-column tables."""
