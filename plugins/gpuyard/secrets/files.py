"""The embedded profile's secret store: one file per secret, `<root>/<team>/<name>`.

Directories are 0700 and files 0600, owned by the control plane's user; values are written
atomically. Workers never read this directory: the local launcher reads the secrets a job names and
puts them into that job's worker environment only.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterable
from pathlib import Path

from gpuyard.domain.spec import dns_label


class SecretNotFound(LookupError):
    """A job names a secret its team's store does not hold."""

    def __init__(self, team: str, names: list[str]):
        self.team, self.names = team, names
        super().__init__(f"team {team} has no secret named {', '.join(repr(n) for n in names)}")


class FileSecretStore:
    def __init__(self, root: Path):
        self.root = root

    def _team_dir(self, team: str, *, create: bool = False) -> Path:
        directory = self.root / dns_label(team)
        if create:
            self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
            directory.mkdir(mode=0o700, exist_ok=True)
        return directory

    def put(self, team: str, name: str, value: str) -> bool:
        """Store the value; returns whether the secret is new."""
        directory = self._team_dir(team, create=True)
        target = directory / dns_label(name)
        created = not target.exists()
        descriptor, partial = tempfile.mkstemp(dir=directory, prefix=".partial-")  # mode 0600
        with os.fdopen(descriptor, "w") as handle:
            handle.write(value)
        os.replace(partial, target)
        return created

    def names(self, team: str) -> list[str]:
        directory = self._team_dir(team)
        if not directory.is_dir():
            return []
        return sorted(p.name for p in directory.iterdir() if not p.name.startswith("."))

    def delete(self, team: str, name: str) -> bool:
        try:
            (self._team_dir(team) / dns_label(name)).unlink()
        except FileNotFoundError:
            return False
        return True

    def read(self, team: str, names: Iterable[str]) -> dict[str, str]:
        """The values of `names`, or SecretNotFound naming every missing one."""
        values, missing = {}, []
        for name in names:
            try:
                values[name] = (self._team_dir(team) / dns_label(name)).read_text()
            except FileNotFoundError:
                missing.append(name)
        if missing:
            raise SecretNotFound(team, missing)
        return values


def home_store(home: Path) -> FileSecretStore:
    """The embedded instance's store: `<home>/secrets`, inside the 0700 home."""
    return FileSecretStore(home / "secrets")
