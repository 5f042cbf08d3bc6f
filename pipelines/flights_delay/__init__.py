"""flights_delay's folder: its definition (pipeline.yaml) and its data source, 2013 New York flights
(source.py), with the source's suites, Spark jobs (spark_jobs/) and pandas preparation."""

HOME_TIMEZONE = "America/New_York"  # the raw tables' local days and clocks: New York's
