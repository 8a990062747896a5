"""Deterministic replicated queue state: commands, QueueState, DueIndex. No I/O, no clock."""
