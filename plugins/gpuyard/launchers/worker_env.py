"""What a local worker process gets: its environment, its user, its own directory, and nothing more.

Environment: built from nothing. From the launcher's own environment only `INHERITED` (locale, time
zone, the dynamic loader's library path) passes; then PATH (this interpreter's directory first),
HOME and TMPDIR (the worker's own directory), USER and LOGNAME; then the job's `env`, its secrets
(`env_from_secret`, read from the team's store now, at launch), and last the launcher's variables
(rendezvous, GPUYARD_*, CUDA_VISIBLE_DEVICES), which the spec cannot name. The server's GPUYARD_HOME,
database URL, tokens and cloud credentials never reach a worker.

Identity: when the launcher runs as root, a team's workers run as the team's own unprivileged user
(uid = gid = WORKER_UID_BASE + n; n is given to each team once, on its first launch, and kept in
`<launcher root>/worker-uids.json`), through `privilege_drop`: no supplementary groups,
no_new_privs, umask 077. Teams therefore cannot read each other's files, processes or environments
(nor the control plane's home, mode 0700). When the launcher is not root, workers run as its user.

Own directory: `<system temp>/gpuyard-sandboxes-<launcher uid>/<attempt id>`, mode 0700, owned by
the worker's user; it outlives the attempt until `remove_sandbox`.
"""

from __future__ import annotations

import contextlib
import fcntl
import getpass
import json
import os
import shutil
import stat
import sys
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from gpuyard.launchers.base import LaunchRequest
from gpuyard.secrets.files import FileSecretStore

INHERITED = ("LANG", "LANGUAGE", "LC_ALL", "LC_CTYPE", "LC_MESSAGES", "LC_NUMERIC", "TZ", "LD_LIBRARY_PATH")
SYSTEM_PATH = "/usr/local/bin:/usr/bin:/bin"
WORKER_UID_BASE = 300_000_000  # far above login users (1000+) and the usual subordinate ranges (100000+)
MAX_TEAMS = 1_000_000
IDENTITIES_FILE = "worker-uids.json"


class SandboxError(OSError):
    """The worker's directory or identity cannot be set up safely; the message says why."""


@dataclass(frozen=True)
class WorkerIdentity:
    uid: int
    gid: int
    name: str


@dataclass(frozen=True)
class WorkerSandbox:
    """One attempt's workers: the identity they run as, their directory, their base environment."""

    identity: WorkerIdentity | None  # None: the launcher's own user
    directory: Path
    base: Mapping[str, str]

    def environment(self, launcher_vars: Mapping[str, str]) -> dict[str, str]:
        """A worker's whole environment: the base, then the launcher's variables of this worker."""
        return {**self.base, **launcher_vars}

    def command(self, command: Sequence[str]) -> list[str]:
        """`command`, run as the worker's identity."""
        if self.identity is None:
            return list(command)
        drop = [sys.executable, "-m", "gpuyard.launchers.privilege_drop"]
        return [*drop, str(self.identity.uid), str(self.identity.gid), "--", *command]


def prepare(
    request: LaunchRequest,
    launcher_root: Path,
    secrets: FileSecretStore,
    *,
    inherited: Mapping[str, str] = os.environ,
) -> WorkerSandbox:
    """Resolve the job's secrets, its team's identity, and create the attempt's own directory.

    Raises SecretNotFound (a job names a secret its team lacks) or SandboxError; nothing is started.
    """
    spec = request.spec
    if Path(request.attempt_id).name != request.attempt_id:
        raise SandboxError(f"attempt id {request.attempt_id!r} cannot name a directory")
    values = secrets.read(spec.team, spec.env_from_secret.values()) if spec.env_from_secret else {}
    identity = team_identity(launcher_root, spec.team) if os.geteuid() == 0 else None
    if identity is not None:
        _check_runnable_by_others(Path(sys.executable))
    directory = _own_directory(request.attempt_id, identity)
    user = identity.name if identity else getpass.getuser()
    base = {
        **{name: inherited[name] for name in INHERITED if name in inherited},
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{SYSTEM_PATH}",
        "HOME": str(directory),
        "TMPDIR": str(directory),
        "USER": user,
        "LOGNAME": user,
        **spec.env,
        **{var: values[name] for var, name in spec.env_from_secret.items()},
    }
    return WorkerSandbox(identity, directory, base)


def team_identity(launcher_root: Path, team: str) -> WorkerIdentity:
    """The team's worker user, given once and for good (a lock makes concurrent launchers agree)."""
    launcher_root.mkdir(mode=0o700, parents=True, exist_ok=True)
    path = launcher_root / IDENTITIES_FILE
    with _locked(launcher_root / f"{IDENTITIES_FILE}.lock"):
        given: dict[str, int] = json.loads(path.read_text()) if path.exists() else {}
        if team not in given:
            if len(given) >= MAX_TEAMS:
                raise SandboxError(f"{path}: every one of the {MAX_TEAMS} worker users is taken")
            given[team] = WORKER_UID_BASE + len(given)
            partial = path.with_suffix(".tmp")
            partial.write_text(json.dumps(given, indent=1, sort_keys=True))
            os.replace(partial, path)
    uid = given[team]
    return WorkerIdentity(uid=uid, gid=uid, name=f"gpuyard-{team}")


def _check_runnable_by_others(interpreter: Path) -> None:
    """A worker user (neither owner nor group of anything here) must be able to run the interpreter:
    every directory on the way to it enterable by others, the file executable by others."""
    target = interpreter.resolve()
    for directory in reversed(target.parents):
        if not directory.stat().st_mode & stat.S_IXOTH:
            raise SandboxError(
                f"worker users cannot run {interpreter} (it is {target}): {directory} is closed to other "
                f"users (mode {directory.stat().st_mode & 0o777:o}); build the environment from an "
                "interpreter every user may run, such as /usr/bin/python3 (docs/security.md)"
            )
    if not target.stat().st_mode & stat.S_IXOTH:
        raise SandboxError(f"worker users cannot run {target}: it is not executable by other users")


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def sandboxes_root() -> Path:
    return Path(tempfile.gettempdir()) / f"gpuyard-sandboxes-{os.geteuid()}"


def _own_directory(attempt_id: str, identity: WorkerIdentity | None) -> Path:
    root = sandboxes_root()
    with contextlib.suppress(FileExistsError):
        root.mkdir(mode=0o711)
    found = root.lstat()
    # The temp directory is shared: never trust a root someone else made (or a link to elsewhere).
    if not stat.S_ISDIR(found.st_mode) or found.st_uid != os.geteuid() or found.st_mode & 0o022:
        raise SandboxError(f"{root} is not a directory of user {os.geteuid()} that only it may write")
    root.chmod(0o711)  # the workers pass through, they do not list
    directory = root / attempt_id
    with contextlib.suppress(FileExistsError):  # a launch retried after the launcher died
        directory.mkdir(mode=0o700)
    if identity is not None:
        os.chown(directory, identity.uid, identity.gid)
    return directory


def remove_sandbox(attempt_id: str) -> None:
    """Delete the attempt's own directory (once its workers have all ended)."""
    shutil.rmtree(sandboxes_root() / attempt_id, ignore_errors=True)
