"""The domain model: immutable values and the state machines. Depends on nothing else in gpuyard."""
