"""The offline source of a prepared table, shared by every source's Feast definitions file.

A rendered repository holds one definitions file (pipelines/features.py copies it as definitions.py),
so the files cannot import each other: they import this module by its package path.
"""

from __future__ import annotations

from feast import FileSource
from feast.data_source import DataSource


def prepared_table(prepared_root: str, offline_source: str, table: str, description: str) -> DataSource:
    """Prepared table `table` under `prepared_root`, read by Feast's file store (``file``) or by Spark
    (``spark``, production)."""
    path = f"{prepared_root.rstrip('/')}/{table}"
    if offline_source == "spark":
        from feast.infra.offline_stores.contrib.spark_offline_store.spark_source import SparkSource

        # No date_partition_column: Feast prunes it by the UTC month of its time bounds, and the
        # months are the source's local months, which begin hours off UTC's.
        return SparkSource(
            name=table,
            path=path,
            file_format="parquet",
            timestamp_field="event_timestamp",
            description=description,
        )
    if offline_source != "file":
        raise ValueError(f"offline_source: expected 'file' or 'spark', got {offline_source!r}")
    return FileSource(name=table, path=path, timestamp_field="event_timestamp", description=description)
