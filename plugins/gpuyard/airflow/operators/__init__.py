"""Operators: GpuTrainingOperator."""
