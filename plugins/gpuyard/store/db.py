"""Engines for PostgreSQL (psycopg 3) and SQLite, every wait on PostgreSQL bounded, and migration.

Bounds on a PostgreSQL connection (docs/faults.md says what each component does when they fire):
- the server cancels a statement after `statement_timeout_s` (lock waits included), and ends a
  session left idle inside a transaction after `idle_in_transaction_s`, releasing its locks;
- TCP keepalives on both ends probe a connection idle for `keepalive_s` and declare the peer dead
  after three unanswered probes; `tcp_user_timeout` drops a link whose sent data stays unacknowledged;
- the client gives up on any one wait for the server `CLIENT_MARGIN_S` after the statement timeout
  (`BoundedConnection`): a server or link that accepts but never answers (a black hole) answers no
  cancel request either, so the client closes the connection, which SQLAlchemy then treats as a
  disconnect (the pool is refilled with fresh connections).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
from psycopg.errors import _WaitTimeout  # psycopg >= 3.2: raised by Connection.wait(timeout=...)
from sqlalchemy import Connection, Engine, create_engine, event
from sqlalchemy.engine import make_url

from gpuyard.settings import DB_IDLE_IN_TRANSACTION_S, DB_KEEPALIVE_S, DB_STATEMENT_TIMEOUT_S, Settings

MIGRATIONS = Path(__file__).parent / "migrations"
# The server's own cancel (statement_timeout) comes first; the client waits this much longer for it.
CLIENT_MARGIN_S = 5.0
MIGRATION_WAIT_S = 3600.0


@dataclass(frozen=True)
class DbBounds:
    """How long a PostgreSQL connection may wait, in seconds (settings: `db_*_seconds`)."""

    statement_timeout_s: float = DB_STATEMENT_TIMEOUT_S
    idle_in_transaction_s: float = DB_IDLE_IN_TRANSACTION_S
    keepalive_s: float = DB_KEEPALIVE_S
    connect_timeout_s: float = 5.0

    @classmethod
    def from_settings(cls, settings: Settings) -> DbBounds:
        return cls(
            statement_timeout_s=settings.db_statement_timeout_seconds,
            idle_in_transaction_s=settings.db_idle_in_transaction_seconds,
            keepalive_s=settings.db_keepalive_seconds,
        )

    def __post_init__(self) -> None:
        for name in ("statement_timeout_s", "idle_in_transaction_s", "keepalive_s", "connect_timeout_s"):
            if getattr(self, name) < 1:
                raise ValueError(f"DbBounds.{name}: expected at least 1 second, got {getattr(self, name)}")

    @property
    def wait_limit_s(self) -> float:
        """The longest the client waits for one answer of the server."""
        return self.statement_timeout_s + CLIENT_MARGIN_S

    def connect_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of `Bounded(Async)Connection.connect` that carry these bounds: libpq's
        parameters (the server's settings in `options`) and the client's wait limit."""
        keepalive = round(self.keepalive_s)
        server = {
            "statement_timeout": f"{round(self.statement_timeout_s * 1000)}",
            "idle_in_transaction_session_timeout": f"{round(self.idle_in_transaction_s * 1000)}",
            "tcp_keepalives_idle": str(keepalive),
            "tcp_keepalives_interval": str(max(1, keepalive // 3)),
            "tcp_keepalives_count": "3",
        }
        return {
            "connect_timeout": str(max(1, round(self.connect_timeout_s))),
            "keepalives": "1",
            "keepalives_idle": str(keepalive),
            "keepalives_interval": str(max(1, keepalive // 3)),
            "keepalives_count": "3",
            "tcp_user_timeout": str(round(self.wait_limit_s * 1000)),
            "options": " ".join(f"-c {name}={value}" for name, value in server.items()),
            "wait_limit_s": self.wait_limit_s,
        }


class BoundedConnection(psycopg.Connection[Any]):
    """A psycopg connection whose every wait for the server ends after `wait_limit_s`: then it
    closes itself (a query is still in flight; the connection is unusable) and raises."""

    wait_limit_s: float | None = None

    @classmethod
    def connect(  # type: ignore[override]
        cls, conninfo: str = "", *, wait_limit_s: float | None = None, **kwargs: Any
    ) -> BoundedConnection:
        connection = super().connect(conninfo, **kwargs)
        connection.wait_limit_s = wait_limit_s
        return connection

    def wait(self, gen: Any, interval: float = 0.1, timeout: float | None = None) -> Any:
        try:
            return super().wait(gen, interval, self.wait_limit_s if timeout is None else timeout)
        except _WaitTimeout:
            self.close()
            raise psycopg.OperationalError(
                f"the database did not answer within {self.wait_limit_s:g}s; connection closed"
            ) from None


class BoundedAsyncConnection(psycopg.AsyncConnection[Any]):
    """`BoundedConnection` for asyncio (psycopg_pool: `connection_class=BoundedAsyncConnection`,
    `kwargs={"wait_limit_s": ...}`)."""

    wait_limit_s: float | None = None

    @classmethod
    async def connect(  # type: ignore[override]
        cls, conninfo: str = "", *, wait_limit_s: float | None = None, **kwargs: Any
    ) -> BoundedAsyncConnection:
        connection = await super().connect(conninfo, **kwargs)
        connection.wait_limit_s = wait_limit_s
        return connection

    async def wait(self, gen: Any, interval: float = 0.1, timeout: float | None = None) -> Any:
        try:
            return await super().wait(gen, interval, self.wait_limit_s if timeout is None else timeout)
        except _WaitTimeout:
            await self.close()
            raise psycopg.OperationalError(
                f"the database did not answer within {self.wait_limit_s:g}s; connection closed"
            ) from None


def _normalize(url: str) -> str:
    # "postgresql://" means psycopg 3 here, never psycopg2.
    if url.startswith("postgresql://") or url.startswith("postgres://"):
        return "postgresql+psycopg://" + url.split("://", 1)[1]
    return url


def make_engine(url: str, *, pool_size: int = 16, bounds: DbBounds | None = None) -> Engine:
    url = _normalize(url)
    if url.startswith("sqlite"):
        return _sqlite_engine(url)
    connect = (bounds or DbBounds()).connect_kwargs()
    if "options" in make_url(url).query:  # the URL's own server settings come last: they win
        connect["options"] += " " + str(make_url(url).query["options"])
    engine = create_engine(
        url,
        pool_size=pool_size,
        max_overflow=pool_size,
        # No pre-ping (a round trip per checkout on the hot path): a dropped connection raises a
        # disconnect error, SQLAlchemy invalidates the pool, and the API answers 503 until it is back.
        pool_timeout=10,
        connect_args=connect,
    )

    @event.listens_for(engine, "do_connect")
    def _bounded(_dialect: Any, _record: Any, cargs: Any, cparams: Any) -> BoundedConnection:
        return BoundedConnection.connect(*cargs, **cparams)

    return engine


def _sqlite_engine(url: str) -> Engine:
    database = make_url(url).database
    if database and database != ":memory:":
        Path(database).parent.mkdir(parents=True, exist_ok=True)
    engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30})

    @event.listens_for(engine, "connect")
    def _sqlite_connect(dbapi_connection: Any, _record: Any) -> None:
        # We issue BEGIN ourselves (below) so that writers take the lock up front.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.execute("PRAGMA busy_timeout=30000")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _sqlite_begin(connection: Any) -> None:
        # IMMEDIATE: two writers never deadlock upgrading shared locks; one waits instead.
        connection.exec_driver_sql("BEGIN IMMEDIATE")

    return engine


@contextlib.contextmanager
def migration_bounds(connection: Connection) -> Iterator[None]:
    """For the rest of this transaction, no statement timeout and a client wait of
    `MIGRATION_WAIT_S` (a migration may legitimately run for minutes, but a process starting while
    the database is black-holed must not hang for ever); the next transaction is bounded again."""
    if connection.dialect.name != "postgresql":
        yield
        return
    driver = connection.connection.driver_connection
    limit = getattr(driver, "wait_limit_s", None)
    connection.exec_driver_sql("SET LOCAL statement_timeout = 0")
    driver.wait_limit_s = MIGRATION_WAIT_S  # type: ignore[union-attr]
    try:
        yield
    finally:
        driver.wait_limit_s = limit  # type: ignore[union-attr]


# The advisory lock every migration takes ("gpuy"), so replicas and Jobs started at once never race.
MIGRATION_LOCK = 0x67707579


class SchemaNotAtHead(RuntimeError):
    """The database's schema is not the revision this code needs; the message says what to run."""


def _alembic_config() -> Any:
    # Imported here: alembic costs a second of start-up to every process that only reads settings.
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    return config


def head_revision() -> str:
    """The newest revision of the migrations shipped with this code."""
    from alembic.script import ScriptDirectory

    head = ScriptDirectory.from_config(_alembic_config()).get_current_head()
    assert head is not None, f"no migrations under {MIGRATIONS}"
    return head


def current_revision(connection: Connection) -> str | None:
    """The revision the database is at; None for a database never migrated."""
    from alembic.migration import MigrationContext

    return MigrationContext.configure(connection).get_current_revision()


def _try_lock(connection: Connection) -> bool:
    return bool(connection.exec_driver_sql(f"SELECT pg_try_advisory_xact_lock({MIGRATION_LOCK})").scalar())


def migrate(engine: Engine, on_wait: Callable[[], None] | None = None) -> tuple[str | None, str]:
    """Bring the schema to the newest revision (idempotent); returns (revision before, after).

    On PostgreSQL the transaction first takes the advisory lock `MIGRATION_LOCK`, so concurrent
    migrations run one after the other (the later ones find the schema at head and do nothing);
    `on_wait` is called when another holds it. SQLite's `BEGIN IMMEDIATE` serializes them already.
    """
    from alembic import command

    config = _alembic_config()
    with engine.begin() as connection, migration_bounds(connection):
        if connection.dialect.name == "postgresql" and not _try_lock(connection):
            if on_wait is not None:
                on_wait()
            connection.exec_driver_sql(f"SELECT pg_advisory_xact_lock({MIGRATION_LOCK})")
        before = current_revision(connection)
        config.attributes["connection"] = connection
        command.upgrade(config, "head")
        return before, head_revision()


def require_head(engine: Engine) -> None:
    """Refuse a database whose schema is not at this code's head (production replicas never migrate)."""
    with engine.connect() as connection:
        current = current_revision(connection)
    head = head_revision()
    if current != head:
        found = f"revision {current}" if current else "no revision (never migrated)"
        raise SchemaNotAtHead(
            f"the database schema is at {found}, this gpuyard needs revision {head}: "
            "run `gpuyard migrate` (deploy/: the gpuyard-migrate Job) before starting it"
        )


def open_engine(settings: Settings, pool_size: int) -> Engine:
    """The store's engine, bounded by the `db_*_seconds` settings; its schema left as it is."""
    return make_engine(
        str(settings.database_url), pool_size=pool_size, bounds=DbBounds.from_settings(settings)
    )


def open_store(settings: Settings) -> Engine:
    """The store's engine, its schema migrated (embedded) or checked to be at head (production:
    `gpuyard migrate` runs once; raises SchemaNotAtHead naming it)."""
    engine = open_engine(settings, settings.db_pool_size)
    if settings.migrate_at_start:
        migrate(engine)
    else:
        require_head(engine)
    return engine
