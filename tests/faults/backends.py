"""PostgreSQL and Redis of the suite's own, which it restarts and flushes without touching the
servers other tests share. PostgreSQL is a throwaway cluster (initdb, pg_ctl, as the `postgres`
user when run as root); Redis is `servers.RedisServer` (no persistence: a restart loses everything).
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import psycopg
import redis
from servers import RedisServer, free_port

DATABASE = "gpuyard"


class Postgres:
    def __init__(self) -> None:
        initdb = shutil.which("initdb") or next(
            iter(sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))), None
        )
        if initdb is None:
            raise RuntimeError("the fault suite needs PostgreSQL's initdb (apt-get install postgresql)")
        self.bin = Path(initdb).parent
        # Its own directory: the postgres user must reach it, and a run directory is root's.
        self.directory = Path(tempfile.mkdtemp(prefix="gpuyard-faults-pg-"))
        self.data, self.port = self.directory / "data", free_port()
        self.run_as = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        if self.run_as:
            shutil.chown(self.directory, "postgres")

    @property
    def admin_url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def url(self, port: int | None = None, host: str = "127.0.0.1") -> str:
        """The suite's database, directly or through a proxy listening on `host`:`port`."""
        return f"postgresql://postgres@{host}:{port or self.port}/{DATABASE}"

    def _ctl(self, *args: str) -> None:
        subprocess.run(
            [*self.run_as, str(self.bin / "pg_ctl"), "-D", str(self.data), *args],
            check=True,
            capture_output=True,
            timeout=120,
        )

    def start(self) -> Postgres:
        if not self.data.exists():
            subprocess.run(
                [
                    *self.run_as,
                    str(self.bin / "initdb"),
                    "-D",
                    str(self.data),
                    "-U",
                    "postgres",
                    "--auth=trust",
                ],
                check=True,
                capture_output=True,
            )
        self._ctl(
            "-w",
            "-l",
            str(self.directory / "postgres.log"),
            "start",
            "-o",
            f"-p {self.port} -k {self.directory} -c listen_addresses=127.0.0.1 -c fsync=off "
            "-c max_connections=300",
        )
        with psycopg.connect(self.admin_url, autocommit=True) as conn:
            if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (DATABASE,)).fetchone():
                conn.execute(f'CREATE DATABASE "{DATABASE}"')
        return self

    def restart(self, *, crash: bool) -> None:
        """Restart the server: `crash` is an immediate shutdown (recovery on start), else a fast one."""
        self._ctl(
            "-w",
            "-l",
            str(self.directory / "postgres.log"),
            "-m",
            "immediate" if crash else "fast",
            "restart",
        )

    def stop(self) -> None:
        if self.data.exists():
            subprocess.run(
                [*self.run_as, str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "stop"],
                check=False,
                capture_output=True,
            )
        shutil.rmtree(self.directory, ignore_errors=True)


class Redis(RedisServer):
    def restart(self) -> None:
        self.stop()
        self.start()

    def flushall(self) -> None:
        client = redis.Redis(port=self.port, socket_timeout=5)
        try:
            client.flushall()
        finally:
            client.close()


class SmallDisk:
    """A tmpfs of the suite's own mounted at `path`, which `fill` makes full (every write fails with
    ENOSPC, as on a real full disk) until `free`. Needs root (mount); `mount` says if it could."""

    def __init__(self, path: Path, size_mb: int):
        self.path, self.size_mb = path, size_mb
        self.mounted = False
        self._ballast = path / ".ballast"

    def mount(self) -> bool:
        self.path.mkdir(parents=True, exist_ok=True)
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={self.size_mb}m,mode=0755", "tmpfs", str(self.path)],
            capture_output=True,
        )
        self.mounted = done.returncode == 0
        return self.mounted

    def fill(self) -> None:
        """Take every free block: most at once, then the rest page by page until ENOSPC."""
        with open(self._ballast, "ab", buffering=0) as ballast:
            with contextlib.suppress(OSError):
                os.posix_fallocate(ballast.fileno(), 0, max(1, shutil.disk_usage(self.path).free - (1 << 20)))
            ballast.seek(0, os.SEEK_END)
            page = b"\0" * 4096
            with contextlib.suppress(OSError):  # ENOSPC: full
                while True:
                    ballast.write(page)

    def free(self) -> None:
        self._ballast.unlink(missing_ok=True)

    def unmount(self, keep: Path) -> None:
        """Unmount, keeping a copy of what it holds in `keep` (for the post-mortem of a seed)."""
        if self.mounted:
            self.free()
            shutil.copytree(self.path, keep, dirs_exist_ok=True, ignore_dangling_symlinks=True)
            subprocess.run(["umount", "--lazy", str(self.path)], capture_output=True)
            self.mounted = False
