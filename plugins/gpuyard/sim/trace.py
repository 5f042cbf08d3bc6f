"""Read a job trace in the Philly CSV format (timestamp, duration, num_gpus, [gpu_time], cluster).

Any window of any file in that format: rows are validated one by one and a bad row is refused with
its line number and column, never skipped silently. The `cluster` column (Philly's virtual cluster,
one team's quota) becomes the job's team.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

REQUIRED_COLUMNS = ("timestamp", "duration", "num_gpus", "cluster")
TIME_FORMAT = "%Y-%m-%d %H:%M:%S"


class TraceError(ValueError):
    """A trace that cannot be replayed: the message names the file, the row and the column."""


@dataclass(frozen=True)
class TraceJob:
    """One job of the trace. `duration_s` is run time at `gpus` GPUs; only the simulator reads it."""

    id: str
    team: str
    submitted_at: datetime
    duration_s: float
    gpus: int
    gpu_types: tuple[str, ...] = ()  # the GPU models it may run on; empty: any
    gpu_share: float = 1.0  # of each leased GPU it uses (a fractional request placed on a whole GPU)


def parse_time(text: str) -> datetime:
    """`YYYY-MM-DD[ HH:MM:SS]` or ISO 8601, as UTC."""
    text = text.strip()
    try:
        value = datetime.strptime(text, TIME_FORMAT) if len(text) == 19 and "T" not in text else None
        if value is None:
            value = datetime.fromisoformat(text)
    except ValueError as error:
        raise ValueError(f"expected a time like 2017-10-01 or 2017-10-01 12:00:00, got {text!r}") from error
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def _row_error(path: Path, line: int, column: str, expected: str, got: str) -> TraceError:
    return TraceError(f"{path}: row {line}, column {column!r}: expected {expected}, got {got!r}")


def csv_rows(
    path: Path, required: tuple[str, ...], what: str, has: str
) -> Iterator[tuple[int, dict[str, str]]]:
    """(line number, row) of a CSV file that has the `required` columns (names stripped). Errors name
    the file as `what` (`trace`, `pod list`) and, for a missing column, say what such a file `has`."""
    try:
        handle = path.open(newline="")
    except OSError as error:
        raise TraceError(f"{what} {path}: {error}") from error
    with handle:
        reader = csv.DictReader(handle)
        header = [name.strip() for name in reader.fieldnames or []]
        missing = [c for c in required if c not in header]
        if missing:
            raise TraceError(f"{path}: missing column(s) {missing}; {has}, this file has {header}")
        reader.fieldnames = header
        yield from enumerate(reader, start=2)  # line 1 is the header


def read_trace(
    path: Path,
    start: datetime | None = None,
    end: datetime | None = None,
    min_duration_s: float = 0.0,
) -> list[TraceJob]:
    """The jobs submitted in [start, end) that ran at least `min_duration_s`, ordered by submit time.

    Every row is validated, also those outside the window, so a broken file fails whatever the window.
    """
    jobs: list[TraceJob] = []
    has = f"a Philly-format trace has {list(REQUIRED_COLUMNS)} (gpu_time optional)"
    for line, row in csv_rows(path, REQUIRED_COLUMNS, "trace", has):
        jobs_row = _parse_row(path, line, row)
        if jobs_row is None:
            continue
        if start is not None and jobs_row.submitted_at < start:
            continue
        if end is not None and jobs_row.submitted_at >= end:
            continue
        if jobs_row.duration_s < min_duration_s:
            continue
        jobs.append(jobs_row)
    jobs.sort(key=lambda j: (j.submitted_at, j.id))
    return jobs


def _parse_row(path: Path, line: int, row: Mapping[str, str | None]) -> TraceJob | None:
    if all(not (v or "").strip() for v in row.values() if isinstance(v, str)):
        return None  # a blank line
    raw = {c: (row.get(c) or "").strip() for c in REQUIRED_COLUMNS}
    try:
        submitted = parse_time(raw["timestamp"])
    except ValueError:
        raise _row_error(path, line, "timestamp", "YYYY-MM-DD HH:MM:SS", raw["timestamp"]) from None
    try:
        duration = float(raw["duration"])
    except ValueError:
        raise _row_error(path, line, "duration", "seconds as a number", raw["duration"]) from None
    if not math.isfinite(duration) or duration < 0:
        raise _row_error(path, line, "duration", "finite seconds >= 0", raw["duration"])
    try:
        gpus_float = float(raw["num_gpus"])
    except ValueError:
        raise _row_error(path, line, "num_gpus", "a whole number of GPUs >= 1", raw["num_gpus"]) from None
    if not gpus_float.is_integer() or gpus_float < 1:
        raise _row_error(path, line, "num_gpus", "a whole number of GPUs >= 1", raw["num_gpus"])
    if not raw["cluster"]:
        raise _row_error(path, line, "cluster", "a team (virtual cluster) name", raw["cluster"])
    return TraceJob(
        id=f"j{line:07d}",
        team=raw["cluster"],
        submitted_at=submitted,
        duration_s=duration,
        gpus=int(gpus_float),
    )
