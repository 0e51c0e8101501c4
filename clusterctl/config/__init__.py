"""What the user wrote: YAML with lines, the inventory, host patterns, the job spec, ids (pure)."""
