"""How dated tables lie on storage: raw landing tables by day, prepared tables by month (pure policy).

Raw tables land one day at a time (``<table>/date=YYYY-MM-DD/``): a day is what arrives, what a
correction replaces and what an asset event names. Prepared tables are written for ranges of days
and read by ranges, so they are bucketed by month (``<table>/date_month=YYYY-MM/part-*.parquet``, rows
sorted by ``date``, which stays a column): one file per month and table instead of one per day
(at 20 years, 960 files for the four flight tables instead of 29,200). Readers filter on ``date``;
the sort lets parquet's row-group statistics skip what a filter excludes. Both the Spark jobs and
the pandas steps (pipelines/storage.py) follow this module.
"""

from __future__ import annotations

import datetime as dt

DAY_KEY = "date"
MONTH_KEY = "date_month"


def month_of(day: dt.date | str) -> str:
    """``YYYY-MM`` of a date or an ISO date string."""
    return (day.isoformat() if isinstance(day, dt.date) else str(day))[:7]


def months(start: dt.date, end: dt.date) -> list[str]:
    """Every month touched by ``start..end`` (inclusive), oldest first."""
    if end < start:
        raise ValueError(f"end {end} is before start {start}")
    found, year, month = [], start.year, start.month
    while (year, month) <= (end.year, end.month):
        found.append(f"{year:04d}-{month:02d}")
        year, month = (year + 1, 1) if month == 12 else (year, month + 1)
    return found


def days(start: dt.date, end: dt.date) -> list[dt.date]:
    """Every day of ``start..end`` (inclusive), oldest first."""
    return [start + dt.timedelta(days=i) for i in range((end - start).days + 1)]


def partition_name(key: str, value: str) -> str:
    return f"{key}={value}"
