"""Shared fixtures: real PostgreSQL and Redis servers, a directory local workers can reach.

The machine's servers are used when they answer (127.0.0.1:5432 and :6379, or the URLs in
GPUYARD_TEST_POSTGRES_URL / GPUYARD_TEST_REDIS_URL); otherwise throwaway ones are started from
local binaries for the session, so the suite runs on any machine with PostgreSQL and Redis installed.
"""

from __future__ import annotations

import gc
import os
import shutil
import uuid
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager as ContextManager
from pathlib import Path

import mlflow_targets
import pytest
import redis
from cpu_profile import CpuProfile
from gpuyard.store.db import make_engine, migrate
from local_cluster import services
from servers import RedisServer, S3Server, open_directory
from sqlalchemy import Engine
from stores import empty_store, migrated_sqlite, throwaway_database
from suite_scheduling import StartsFirst, first_group
from xdist.remote import Producer

# The variable that names a server for the suite, and the machine's own.
POSTGRES = ("GPUYARD_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test")
REDIS = ("GPUYARD_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")


def _server(
    variable: str,
    default: str,
    throwaway: Callable[[Path], ContextManager[str]],
    scratch: pytest.TempPathFactory,
) -> Iterator[str]:
    """The URL of the server `variable` names, else of the machine's at `default` when it answers,
    else of a throwaway one started for the session."""
    if variable in os.environ:
        yield os.environ[variable]
    else:
        with services.running_or_throwaway(default, throwaway, scratch.mktemp("server")) as url:
            yield url


@pytest.fixture(scope="session")
def postgres_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """URL of an administrative database on a running PostgreSQL server."""
    yield from _server(*POSTGRES, services.throwaway_postgres, tmp_path_factory)


@pytest.fixture(scope="session")
def postgres_url(postgres_server: str) -> Iterator[str]:
    """A database of its own for this test session, dropped at the end."""
    with throwaway_database(postgres_server, "gpuyard_test") as url:
        yield url


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    yield from _server(*REDIS, services.throwaway_redis, tmp_path_factory)


@pytest.fixture(scope="session")
def sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A SQLite store migrated to head once per test process (Alembic costs a second a run), which
    `sqlite_url` copies for each test."""
    return migrated_sqlite(tmp_path_factory.mktemp("sqlite-template") / "gpuyard.db")


@pytest.fixture
def sqlite_url(sqlite_template: Path, tmp_path: Path) -> str:
    """A migrated SQLite store of the test's own."""
    path = tmp_path / "gpuyard.db"
    shutil.copyfile(sqlite_template, path)
    return f"sqlite:///{path}"


@pytest.fixture(scope="session")
def _postgres_engine(postgres_url: str) -> Iterator[Engine]:
    engine = make_engine(postgres_url, pool_size=8)
    migrate(engine)
    yield engine
    engine.dispose()


@pytest.fixture(params=["sqlite", "postgres"])
def database_url(request: pytest.FixtureRequest) -> str:
    """A store at head, empty: a copy of the migrated SQLite template, or the session's PostgreSQL
    database truncated."""
    if request.param == "sqlite":
        return str(request.getfixturevalue("sqlite_url"))
    url: str = request.getfixturevalue("postgres_url")
    empty_store(request.getfixturevalue("_postgres_engine"))
    return url


@pytest.fixture
def throwaway_redis(tmp_path: Path) -> Iterator[RedisServer]:
    """A Redis of the test's own, which the test may kill and restart."""
    server = RedisServer(tmp_path).start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    """An S3 endpoint on loopback (moto's server), once per test process."""
    server = S3Server().start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def s3_bucket(s3_server: S3Server, monkeypatch: pytest.MonkeyPatch) -> str:
    """A new, empty bucket of the test's own (its s3:// URL), this process's S3 clients pointed at it."""
    import fsspec

    for name, value in s3_server.env.items():
        monkeypatch.setenv(name, value)
    fsspec.get_filesystem_class("s3").clear_instance_cache()  # instances keep the endpoint they began with
    return s3_server.create_bucket(f"gpuyard-{uuid.uuid4().hex[:12]}")


@pytest.fixture
def redis_stream(redis_url: str) -> Iterator[str]:
    """A stream name no other test uses; deleted afterwards."""
    name = f"gpuyard:test:{uuid.uuid4().hex[:10]}"
    yield name
    client = redis.Redis.from_url(redis_url)
    client.delete(name)
    client.close()


@pytest.fixture
def open_dir() -> Iterator[Path]:
    """servers.open_directory for one test."""
    with open_directory() as directory:
        yield directory


# Feast's metrics module, when imported, points these at a temporary folder of its own in os.environ
# (feast/metrics.py). Every process a later test started would inherit them: prometheus_client then
# keeps its values in files there, and `gpuyard api` would share its workers' counters through that
# folder instead of its home's. Each test starts and ends with them as they were before any import.
PROMETHEUS_DIRS = ("PROMETHEUS_MULTIPROC_DIR", "PROMETHEUS_MULTIPROCESS_DIR")
PROMETHEUS_BASELINE = {name: os.environ.get(name) for name in PROMETHEUS_DIRS}  # before the tests' imports


def _restore_prometheus_dirs() -> None:
    for name, value in PROMETHEUS_BASELINE.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


@pytest.fixture(autouse=True)
def no_inherited_prometheus_dirs() -> Iterator[None]:
    _restore_prometheus_dirs()
    yield
    _restore_prometheus_dirs()


@pytest.fixture(autouse=True)
def mlflow_targets_restored() -> Iterator[None]:
    """A test that points MLflow at its own store leaves the worker's next test where it found it (a
    random order ran one test against another's store, and one with a server's address where it
    expected none). A module's fixture that points MLflow somewhere uses `mlflow_targets.kept` too."""
    with mlflow_targets.kept():
        yield


# Parallel runs (pytest-xdist, `--dist loadgroup`, as make test runs the suite): a heavy system that
# a module or a folder's conftest starts once (a module- or session-scoped fixture: an Airflow stack,
# a SparkSession, a `gpuyard up` for tests that observe) would start again on every worker that ran
# one of its tests. Its tests go to one worker instead, grouped by where the fixture is defined. The
# session fixtures of this file (servers, databases of a worker's own) are cheap and not grouped.


def shared_fixture_group(item: pytest.Item) -> str | None:
    """Where the first module- or session-scoped fixture the test uses is defined, below this folder."""
    below = f"{Path(__file__).parent.relative_to(item.config.rootpath).as_posix()}/"
    info = getattr(item, "_fixtureinfo", None)
    for name in info.names_closure if info else ():
        for definition in info.name2fixturedefs.get(name, ()):
            if definition.scope in ("module", "session") and definition.baseid.startswith(below):
                return definition.baseid.split("::")[0]
    return None


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the groups into the test ids
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if any(item.iter_markers("xdist_group")):
            continue
        group = shared_fixture_group(item)
        if item.get_closest_marker("starts_first"):
            group = first_group(group or item.nodeid)
        if group:
            item.add_marker(pytest.mark.xdist_group(group))


def pytest_xdist_make_scheduler(config: pytest.Config, log: Producer) -> StartsFirst | None:
    return StartsFirst(config, log) if config.getvalue("dist") == "loadgroup" else None


def pytest_collection_finish(session: pytest.Session) -> None:
    """What collection imported (torch, Airflow, pandas, Spark's client) lives until the worker exits:
    frozen, it is no longer walked by each full garbage collection (in tests/control's fast tests their
    CPU went from 3.6 to 2.2 s a minute) nor by the five that pytest runs at its exit (2 s)."""
    gc.collect()
    gc.freeze()


def pytest_runtest_setup(item: pytest.Item) -> None:
    """`requires(possible, what)`: the suite has no skips (tests/README.md), so a test this machine
    cannot run fails and says what it lacks."""
    for mark in item.iter_markers("requires"):
        possible, what = mark.args
        if not possible:
            pytest.fail(f"this machine cannot run it: {what}", pytrace=False)


def pytest_configure(config: pytest.Config) -> None:
    if "GPUYARD_CPU_PROFILE" in os.environ:  # where the suite's CPU goes (tests/cpu_profile.py)
        config.pluginmanager.register(CpuProfile(Path(os.environ["GPUYARD_CPU_PROFILE"])), "cpu_profile")


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Lines a test asked to show whatever happened (its `summary` property: the fault campaign's seed
    and RESULT), which a pytest-xdist worker's own output never brings to the terminal."""
    lines = [
        str(value)
        for reports in terminalreporter.stats.values()
        for report in reports
        if getattr(report, "when", None) == "call"
        for name, value in getattr(report, "user_properties", ())
        if name == "summary"
    ]
    if lines:
        terminalreporter.section("summaries")
        for line in lines:
            terminalreporter.write_line(line)
