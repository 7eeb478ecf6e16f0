"""The training job's own metrics: step timer, skew and stragglers, operators, allocator, comm, checkpoints, run log."""
