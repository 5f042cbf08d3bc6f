"""The Pollux (OSDI'21) simulator study's model of elastic training jobs, and its baselines.

`profiles`: the measured applications (step and sync time by placement and batch, statistical
efficiency by batch); `jobs`: a workload's submissions and a job's progress; `policies`: the
scheduling policies by name; `replay`: a workload replayed under one of them.
"""
