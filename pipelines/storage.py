"""The data root: fsspec URLs, dated tables and their replacement.

A dated table is laid out by day (``<table>/date=YYYY-MM-DD/``, the raw landing tables) or by month
(``<table>/date_month=YYYY-MM/``, rows carrying ``date``: the prepared tables), as spark_jobs/layout.py
says; readers take either, writers say which they write.

pandas and pyarrow are imported by the functions that read or write tables: the DAG files import
this module for its URLs, and every parse of them and every task process would otherwise pay about
half a CPU-second for them.
"""

from __future__ import annotations

import datetime as dt
import os
import uuid
from collections.abc import Iterable
from typing import TYPE_CHECKING
from urllib.parse import urlparse

import fsspec
from fsspec.spec import AbstractFileSystem

from pipelines.errors import ConfigError, MissingDataError
from spark_jobs import layout

if TYPE_CHECKING:
    import pandas as pd
    import pyarrow.dataset as ds

PARTITION_KEY = "date"


def normalize_url(url: object, what: str = "url") -> str:
    """Return ``url`` as an absolute fsspec URL (local paths become ``file:///abs/path``).

    Raises :class:`ConfigError` naming ``what`` when the URL is empty or its scheme is not an fsspec protocol.
    """
    if not isinstance(url, str) or not url.strip():
        raise ConfigError(f"{what}: expected a non-empty fsspec URL or local path, got {url!r}")
    url = url.strip()
    parsed = urlparse(url)
    scheme = parsed.scheme
    if len(scheme) <= 1:  # no scheme, or a Windows drive letter
        return "file://" + os.path.abspath(os.path.expanduser(url))
    if scheme not in fsspec.available_protocols():
        raise ConfigError(
            f"{what}: unknown URL scheme {scheme!r} in {url!r}; expected a local path or one of "
            f"file://, s3://, gs://, memory:// ... (fsspec protocols)"
        )
    if scheme in ("file", "local"):
        if parsed.netloc not in ("", "localhost"):
            raise ConfigError(f"{what}: file URL {url!r} must be file:///absolute/path")
        return "file://" + os.path.abspath(parsed.path)
    return url.rstrip("/")


def filesystem(url: str) -> tuple[AbstractFileSystem, str]:
    """The fsspec filesystem and path for ``url``; unknown or unusable URLs raise :class:`ConfigError`."""
    try:
        fs, path = fsspec.core.url_to_fs(url)
    except (ImportError, ValueError) as exc:
        raise ConfigError(f"cannot open data URL {url!r}: {exc}") from exc
    return fs, path


def join(url: str, *parts: str) -> str:
    return "/".join([url.rstrip("/"), *(p.strip("/") for p in parts)])


def is_local(url: str) -> bool:
    return urlparse(url).scheme in ("", "file", "local")


def local_path(url: str) -> str:
    """The local filesystem path of a ``file://`` URL (Feast's file source and SQLite need plain paths)."""
    if not is_local(url):
        raise ConfigError(f"expected a local file:// URL, got {url!r}")
    return urlparse(url).path if url.startswith("file:") else url


def shared_root(url: str) -> None:
    """Create a local `url` as a directory every worker user may make folders of its own in: mode
    1777, like /tmp (sticky: each removes only what it owns; a team's workers write with umask 077,
    so what they make is their team's alone). The pipeline runs as the platform's user and its
    training jobs' workers may run as their teams' users (docs/security.md): this is where they
    checkpoint and keep their work directories. An existing directory is left as it is (the platform
    opens no path it did not make); other URLs are the object store's to grant."""
    if not is_local(url):
        return
    path = local_path(url)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        return
    os.chmod(path, 0o1777)


def spark_path(url: str) -> str:
    """The same location as Spark/Hadoop names it (``s3://`` becomes ``s3a://``)."""
    return "s3a://" + url[len("s3://") :] if url.startswith("s3://") else url


def feast_path(url: str) -> str:
    """The same location as Feast's file source names it (a plain path for local data)."""
    return local_path(url) if is_local(url) else url


def partition_url(table_url: str, day: dt.date) -> str:
    return join(table_url, f"{PARTITION_KEY}={day.isoformat()}")


def _children(table_url: str) -> list[str]:
    fs, path = filesystem(table_url)
    if not fs.exists(path):
        return []
    return [str(e).rstrip("/").rsplit("/", 1)[-1] for e in fs.ls(path, detail=False)]


def partition_key(table_url: str) -> str | None:
    """``date`` or ``date_month``: how the table is laid out (None when it has no partitions)."""
    for name in _children(table_url):
        key = name.split("=", 1)[0]
        if key in (layout.DAY_KEY, layout.MONTH_KEY) and "=" in name and "." not in name:
            return key
    return None


def _dataset(table_url: str, key: str) -> ds.Dataset:
    import pyarrow as pa
    import pyarrow.dataset as ds

    fs, path = filesystem(table_url)
    scheme = ds.partitioning(pa.schema([(key, pa.string())]), flavor="hive")
    return ds.dataset(path, filesystem=fs, format="parquet", partitioning=scheme)


def list_partitions(table_url: str) -> list[dt.date]:
    """The dates a table holds (empty when it does not exist). By day: its partition folders; by
    month: the distinct ``date`` values of its files (that column only)."""
    import pyarrow.compute as pc

    key = partition_key(table_url)
    if key == layout.MONTH_KEY:
        dates = pc.unique(_dataset(table_url, key).to_table(columns=[PARTITION_KEY])[PARTITION_KEY])
        return sorted(dt.date.fromisoformat(str(d)) for d in dates.to_pylist())
    days = []
    for name in _children(table_url):
        if name.startswith(f"{PARTITION_KEY}=") and "." not in name:
            try:
                days.append(dt.date.fromisoformat(name.split("=", 1)[1]))
            except ValueError:
                continue
    return sorted(days)


def count_rows(table_url: str, start: dt.date, end: dt.date) -> int:
    """Rows of a table laid out by day for the dates ``start..end`` it holds, from the parquet footers."""
    import pyarrow.parquet as pq

    fs, _ = filesystem(table_url)
    rows = 0
    for day in list_partitions(table_url):
        if start <= day <= end:
            _, path = filesystem(partition_url(table_url, day))
            for file in fs.find(path):
                if file.endswith(".parquet"):
                    with fs.open(file, "rb") as handle:
                        rows += pq.ParquetFile(handle).metadata.num_rows
    return rows


def require_partitions(table_url: str, days: Iterable[dt.date], table: str) -> None:
    """Raise :class:`MissingDataError` naming the table and the dates that have no partition."""
    wanted = sorted(set(days))
    have = set(list_partitions(table_url))
    missing = [d for d in wanted if d not in have]
    if missing:
        shown = ", ".join(d.isoformat() for d in missing[:5]) + (" ..." if len(missing) > 5 else "")
        raise MissingDataError(
            f"table {table!r} at {table_url} has no partition for {len(missing)} date(s): {shown}; "
            f"run the step that produces it first"
        )


def write_partition(df: pd.DataFrame, table_url: str, day: dt.date) -> str:
    """Write ``df`` as the partition of ``day``, replacing what was there (idempotent per partition).

    The new data is written beside the partition first, then swapped in, so a failed write leaves the old
    partition in place.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    fs, _ = filesystem(table_url)
    target = partition_url(table_url, day)
    staging = f"{target}.tmp-{uuid.uuid4().hex[:8]}"
    _, staging_path = filesystem(staging)
    _, target_path = filesystem(target)
    fs.makedirs(staging_path, exist_ok=True)
    table = pa.Table.from_pandas(df.drop(columns=[PARTITION_KEY], errors="ignore"), preserve_index=False)
    with fs.open(f"{staging_path}/part-00000.parquet", "wb") as handle:
        pq.write_table(table, handle)
    if fs.exists(target_path):
        fs.rm(target_path, recursive=True)
    fs.mv(staging_path, target_path, recursive=True)
    return target


def write_table(df: pd.DataFrame, table_url: str) -> str:
    """Write an unpartitioned table as ``<table_url>/data.parquet``, replacing it."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    fs, path = filesystem(table_url)
    fs.makedirs(path, exist_ok=True)
    tmp = f"{path}/.data.parquet.tmp-{uuid.uuid4().hex[:8]}"
    with fs.open(tmp, "wb") as handle:
        pq.write_table(pa.Table.from_pandas(df, preserve_index=False), handle)
    fs.mv(tmp, f"{path}/data.parquet")
    return join(table_url, "data.parquet")


def read_table(table_url: str, table: str) -> pd.DataFrame:
    """Read an unpartitioned table (:func:`write_table`'s, or a Spark job's part files)."""
    import pyarrow.parquet as pq

    fs, path = filesystem(table_url)
    if not fs.exists(path) or not [f for f in fs.ls(path, detail=False) if str(f).endswith(".parquet")]:
        raise MissingDataError(f"table {table!r} does not exist at {table_url}; run the ingest step first")
    # data.parquet as written here, or the part files a Spark job wrote (dot-prefixed staging is skipped)
    return pq.read_table(path, filesystem=fs).to_pandas()


def read_partitions(table_url: str, days: Iterable[dt.date], table: str) -> pd.DataFrame:
    """Read the rows of ``days`` into one DataFrame with a ``date`` column (all must exist)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    days = sorted(set(days))
    require_partitions(table_url, days, table)
    key = partition_key(table_url) or PARTITION_KEY
    wanted = pa.array([d.isoformat() for d in days])
    found = _dataset(table_url, key).to_table(filter=pc.field(PARTITION_KEY).isin(wanted))
    if key == layout.MONTH_KEY:
        found = found.drop_columns([layout.MONTH_KEY])
    if found.num_rows == 0:
        raise MissingDataError(
            f"table {table!r} at {table_url} has empty partitions for {days[0]}..{days[-1]}"
        )
    frame = found.to_pandas()
    frame[PARTITION_KEY] = frame[PARTITION_KEY].astype(str)
    return frame.sort_values(PARTITION_KEY, kind="stable").reset_index(drop=True)


def write_months(
    df: pd.DataFrame, table_url: str, start: dt.date, end: dt.date, sort: Iterable[str] = ()
) -> list[str]:
    """Replace the dates ``start..end`` of a table laid out by month with the rows of ``df``.

    The pandas twin of ``spark_jobs.common.write_months``: months the range only partly covers keep
    their other dates' rows; each month is one file sorted by ``date`` (then ``sort``), staged
    beside the month and swapped in. Returns the months written.
    """
    import pandas as pd
    import pyarrow as pa
    import pyarrow.parquet as pq

    if partition_key(table_url) == PARTITION_KEY:
        raise ConfigError(f"table {table_url} is laid out by day; a prepared table is laid out by month")
    fs, _ = filesystem(table_url)
    order = [PARTITION_KEY, *sort]
    written = []
    in_range = df[PARTITION_KEY].between(start.isoformat(), end.isoformat())
    if not in_range.all():
        raise ConfigError(f"write_months {table_url}: rows outside {start}..{end}")
    month_of_row = df[PARTITION_KEY].str.slice(0, 7)
    for month in layout.months(start, end):
        target = join(table_url, layout.partition_name(layout.MONTH_KEY, month))
        _, target_path = filesystem(target)
        new = df[month_of_row == month]
        if fs.exists(target_path):
            old = pq.read_table(target_path, filesystem=fs).to_pandas()
            outside = ~old[PARTITION_KEY].astype(str).between(start.isoformat(), end.isoformat())
            new = pd.concat([old[outside][list(new.columns)], new], ignore_index=True)
        if new.empty:
            if fs.exists(target_path):
                fs.rm(target_path, recursive=True)
            continue
        new = new.sort_values(order, kind="stable")
        staging = f"{target_path}.tmp-{uuid.uuid4().hex[:8]}"
        fs.makedirs(staging, exist_ok=True)
        with fs.open(f"{staging}/part-00000.parquet", "wb") as handle:
            pq.write_table(pa.Table.from_pandas(new, preserve_index=False), handle)
        if fs.exists(target_path):
            fs.rm(target_path, recursive=True)
        fs.mv(staging, target_path, recursive=True)
        written.append(month)
    return written
