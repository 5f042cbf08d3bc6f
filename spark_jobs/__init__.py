"""The plumbing every source's PySpark jobs share: the session, the command line, reading and writing
dated partitions (common.py) and the layout of the raw and prepared tables (layout.py).

A source's own jobs live in its pipeline's folder, named by `Source.spark_jobs_dir` (flights':
pipelines/flights_delay/spark_jobs/).
"""
