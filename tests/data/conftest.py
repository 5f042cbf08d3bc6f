"""Fixtures of the data-plane tests: one local[2] SparkSession and a small real sample (Jan 2013)."""

from __future__ import annotations

import datetime as dt
import logging
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
# Every Spark JVM the tests start (the session's, spark-submit's) compiles with C1 only: on the
# sample's few thousand rows C2 spent more CPU compiling Spark's generated code than the jobs ran
# (spark-submit adds SPARK_SUBMIT_OPTS to the JVM it starts; the jobs' own flags still apply)
os.environ.setdefault("SPARK_SUBMIT_OPTS", "-XX:TieredStopAtLevel=1")
os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")
logging.getLogger("feast").setLevel(logging.WARNING)
logging.getLogger("great_expectations").setLevel(logging.WARNING)

# Landed raw dates: the look-back of the 7-day route window needs 9 days before the prepared dates.
RAW_START = dt.date(2013, 1, 1)
RAW_END = dt.date(2013, 1, 12)
PREP_START = dt.date(2013, 1, 10)
PREP_END = dt.date(2013, 1, 12)


@pytest.fixture(scope="session")
def spark() -> Iterator[object]:
    from spark_jobs import common

    session = common.build_session("gpuyard-data-tests", "local[2]", shuffle_partitions=2)
    yield session
    session.stop()


@pytest.fixture(scope="session")
def landed_config(tmp_path_factory: pytest.TempPathFactory) -> object:
    """Raw tables of 2013-01-01..12 landed under a temporary data root."""
    from pipelines import ingest
    from pipelines.definition import load_config

    root = tmp_path_factory.mktemp("flights")
    config = load_config(
        data_root=str(root),
        start_date=RAW_START,
        end_date=RAW_END,
        training_start_date=PREP_START,
        training_end_date=PREP_END,
        feast_repo_dir=str(root / "feast_repo"),
        spark_master="local[2]",
        spark_shuffle_partitions=2,
    )
    ingest.ingest(config)
    return config


@pytest.fixture(scope="session")
def prepared_config(landed_config: object, spark: object) -> object:
    """The landed sample prepared by the Spark jobs for 2013-01-10..12."""
    from pipelines import prepare

    config = landed_config.replace(start_date=PREP_START, end_date=PREP_END)  # type: ignore[attr-defined]
    prepare.prepare(config, master="local[2]")
    return config


@pytest.fixture(scope="session")
def feast_config(prepared_config: object) -> object:
    """Feast applied (rendered repo in the temp root) and materialized up to the end of the sample."""
    from pipelines import features

    features.apply(prepared_config)  # type: ignore[arg-type]
    features.materialize(prepared_config, dt.datetime(2013, 1, 13, 5, 0))  # type: ignore[arg-type]
    return prepared_config


@pytest.fixture()
def data_dir(tmp_path: Path) -> Path:
    return tmp_path
