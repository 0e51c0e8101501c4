"""The job's lifecycle values: restart budgets, causes of an end, the job record (pure)."""
