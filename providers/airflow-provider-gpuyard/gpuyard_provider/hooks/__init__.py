"""Hooks: the `gpuyard` connection."""
