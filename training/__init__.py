"""gpuyard worker runtime: the training entry point, checkpoints, heartbeats and the parallelism planner."""
