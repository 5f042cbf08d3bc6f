"""gpuyard PySpark jobs: raw flights -> cleaned labels and feature tables (local mode or spark-submit).

Each job module has ``main(argv)`` taking ``--run-date``, ``--input`` and ``--output``; the pure DataFrame
transformations live in :mod:`spark_jobs.transforms`.
"""
