"""Triggers: GpuJobTrigger, which follows a job through its events in the triggerer."""
