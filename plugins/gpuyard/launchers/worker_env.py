"""What a local worker process gets: its environment, its user, its own directory, and nothing more.

Environment: built from nothing. From the launcher's own environment only `INHERITED` (locale, time
zone, the dynamic loader's library path) passes; then PATH (this interpreter's directory first),
HOME and TMPDIR (the worker's own directory), USER and LOGNAME; then the job's `env`, its secrets
(`env_from_secret`, read from the team's store now, at launch), and last the launcher's variables
(rendezvous, GPUYARD_*, CUDA_VISIBLE_DEVICES), which the spec cannot name. The server's GPUYARD_HOME,
database URL, tokens and cloud credentials never reach a worker.

`passthrough` (setting `worker_env_passthrough`) adds names the operator chooses (a profiler's
LD_PRELOAD, a proxy): nothing else of the server's environment reaches a worker.

Identity (setting `worker_users`): when the launcher runs as root, a team's workers run as the
team's own unprivileged user (uid = gid = WORKER_UID_BASE + n; n is given to each team once, on its
first launch, and kept in `<launcher root>/worker-uids.json`); the shim drops to it when it execs the
worker (`privilege_drop`): no supplementary groups, no_new_privs, umask 077. Teams therefore cannot
read each other's files, processes or environments (nor the control plane's home, mode 0700). The
shim itself, root, gets `helper_environment` (the allowlist, never the job's `env`) and runs in
isolated mode: what a job names reaches only the final exec, after the drop. Changing users needs a
command every user may run and a working directory every user may enter: `on` refuses to start a job
whose command or working directory is not (naming the closed directory); `auto` (the default) is `on`
when every user may reach what this environment's Python jobs need (`python_job_needs`: the
interpreter as named and as resolved, its site-packages, the worker runtime's code, the working
directory) and otherwise fails closed: every job is refused, naming the first closed directory;
`off` (an operator's explicit choice) never changes users. When the launcher is not root, workers
run as its user. The launcher never opens a path for a worker: what a job reads and writes (data,
checkpoints, a tracking store) must be reachable by its team's user by the path's own modes.

Own directory: `<system temp>/gpuyard-sandboxes-<launcher uid>/<attempt id>`, mode 0700, owned by
the worker's user; it outlives the attempt until `remove_sandbox`.
"""

from __future__ import annotations

import contextlib
import getpass
import json
import logging
import os
import shutil
import stat
import sys
import sysconfig
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib.util import find_spec
from pathlib import Path

from gpuyard.launchers.base import LaunchRequest
from gpuyard.launchers.filelock import exclusive
from gpuyard.secrets.files import FileSecretStore
from gpuyard.settings import WorkerUsers

INHERITED = ("LANG", "LANGUAGE", "LC_ALL", "LC_CTYPE", "LC_MESSAGES", "LC_NUMERIC", "TZ", "LD_LIBRARY_PATH")
SYSTEM_PATH = "/usr/local/bin:/usr/bin:/bin"
WORKER_UID_BASE = 300_000_000  # far above login users (1000+) and the usual subordinate ranges (100000+)
MAX_TEAMS = 1_000_000
IDENTITIES_FILE = "worker-uids.json"
RUNTIME_PACKAGES = ("gpuyard", "training")  # what a Python job of this environment imports to report back

log = logging.getLogger(__name__)


class SandboxError(OSError):
    """The worker's directory or identity cannot be set up safely; the message says why."""


@dataclass(frozen=True)
class WorkerIdentity:
    uid: int
    gid: int
    name: str


@dataclass(frozen=True)
class WorkerSandbox:
    """One attempt's workers: the identity they run as, their directory, their base environment, and
    the environment of the launcher's helpers that start them (the shim), which holds nothing a job
    chose: those helpers run with the launcher's privileges."""

    identity: WorkerIdentity | None  # None: the launcher's own user
    directory: Path
    base: Mapping[str, str]
    helpers: Mapping[str, str]

    def environment(self, launcher_vars: Mapping[str, str]) -> dict[str, str]:
        """A worker's whole environment: the base, then the launcher's variables of this worker."""
        return {**self.base, **launcher_vars}

    def helper_environment(self, attempt_id: str) -> dict[str, str]:
        """The shim's environment: the launcher's allowlist and the attempt's label (`_processes_of`)."""
        return {**self.helpers, "GPUYARD_ATTEMPT_ID": attempt_id}

    def shim_arguments(self) -> list[str]:
        """What tells the shim to start the worker as its identity (nothing: as the launcher's user)."""
        return [] if self.identity is None else ["--as", f"{self.identity.uid}:{self.identity.gid}"]


@dataclass(frozen=True)
class UserRule:
    """Whom a launcher's workers run as: their team's user, or the launcher's; `refusal` set: no job
    runs at all, for that reason (`auto` where team users are impossible: it fails closed)."""

    team_users: bool
    refusal: str | None = None


WORKER_PATH = f"{Path(sys.executable).parent}{os.pathsep}{SYSTEM_PATH}"


def user_rule(mode: WorkerUsers, needs: Sequence[Path]) -> UserRule:
    """Whom workers run as under this launcher (see the module's docstring); `needs`: what they must
    reach, for `auto` (`python_job_needs`)."""
    if mode == "off" or os.geteuid() != 0:
        return UserRule(team_users=False)
    if mode == "on":
        return UserRule(team_users=True)
    closed = next(filter(None, map(_closed_to_others, needs)), None)
    if closed is None:
        return UserRule(team_users=True)
    refusal = (
        f"worker_users=auto: workers cannot run as their team's user, since other users cannot reach "
        f"what this environment's Python jobs need: {closed}; build the environment from an interpreter "
        "every user may run, in a directory every user may enter, or set worker_users=off to run every "
        "team's workers as the launcher's user (docs/security.md)"
    )
    log.error("%s; every job is refused until then", refusal)
    return UserRule(team_users=False, refusal=refusal)


def python_job_needs(workdir: Path) -> list[Path]:
    """What a worker user must reach to run a Python job of this environment in `workdir`: the
    interpreter, the environment's packages, the worker runtime's code (an editable install's
    source tree), the working directory, the system temp directory (their own directories' place)."""
    specs = [find_spec(name) for name in RUNTIME_PACKAGES]
    code = [Path(spec.origin).parent for spec in specs if spec is not None and spec.origin]
    paths = {sysconfig.get_path(kind) for kind in ("purelib", "platlib")}
    return [Path(sys.executable), *sorted(Path(p) for p in paths), *code, workdir, sandboxes_root().parent]


def prepare(
    request: LaunchRequest,
    launcher_root: Path,
    secrets: FileSecretStore,
    *,
    users: UserRule,
    workdir: Path,
    inherited: Mapping[str, str] = os.environ,
    passthrough: Sequence[str] = (),
) -> WorkerSandbox:
    """Resolve the job's secrets, its team's identity, and create the attempt's own directory.

    Raises SecretNotFound (a job names a secret its team lacks) or SandboxError; nothing is started.
    """
    spec = request.spec
    if users.refusal is not None:
        raise SandboxError(users.refusal)
    if Path(request.attempt_id).name != request.attempt_id:
        raise SandboxError(f"attempt id {request.attempt_id!r} cannot name a directory")
    values = secrets.read(spec.team, spec.env_from_secret.values()) if spec.env_from_secret else {}
    identity = team_identity(launcher_root, spec.team) if users.team_users and os.geteuid() == 0 else None
    if identity is not None:
        _check_reachable_by_others(spec.command[0], workdir)
    directory = _own_directory(request.attempt_id, identity)
    user = identity.name if identity else getpass.getuser()
    helpers = {name: inherited[name] for name in INHERITED if name in inherited} | {"PATH": WORKER_PATH}
    base = {
        **{name: inherited[name] for name in (*INHERITED, *passthrough) if name in inherited},
        "PATH": WORKER_PATH,
        "HOME": str(directory),
        "TMPDIR": str(directory),
        "USER": user,
        "LOGNAME": user,
        **spec.env,
        **{var: values[name] for var, name in spec.env_from_secret.items()},
    }
    return WorkerSandbox(identity, directory, base, helpers)


def team_identity(launcher_root: Path, team: str) -> WorkerIdentity:
    """The team's worker user, given once and for good (a lock makes concurrent launchers agree)."""
    launcher_root.mkdir(mode=0o700, parents=True, exist_ok=True)
    path = launcher_root / IDENTITIES_FILE
    with exclusive(launcher_root / f"{IDENTITIES_FILE}.lock"):
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


def _closed_to_others(path: Path) -> str | None:
    """Why a worker user (neither owner nor group of anything here) cannot use `path`, or None: every
    directory on the way to it, as named and as resolved, must be enterable by others; a file must be
    executable by them, a directory readable and enterable (Python lists the directories it imports
    from)."""
    named, target = Path(os.path.abspath(path)), path.resolve()
    for directory in (*reversed(named.parents), *reversed(target.parents)):
        if not directory.stat().st_mode & stat.S_IXOTH:
            mode = directory.stat().st_mode & 0o777
            shown = path if target == named else f"{path} (that is {target})"
            return f"{shown}: {directory} is closed to other users (mode {mode:o})"
    found = target.stat()
    wanted = stat.S_IROTH | stat.S_IXOTH if stat.S_ISDIR(found.st_mode) else stat.S_IXOTH
    if found.st_mode & wanted != wanted:
        what = "readable and enterable" if stat.S_ISDIR(found.st_mode) else "executable"
        return f"{target} is not {what} by other users (mode {found.st_mode & 0o777:o})"
    return None


def _check_reachable_by_others(command: str, workdir: Path) -> None:
    found = shutil.which(command, path=WORKER_PATH) if os.sep not in command else command
    if found is None:
        raise SandboxError(f"command {command!r} is not found on the workers' PATH ({WORKER_PATH})")
    closed = _closed_to_others(Path(found))
    if closed is not None:
        raise SandboxError(
            f"worker users cannot run {command!r}: {closed}; a job's command must be runnable by every "
            "user (build the environment from an interpreter such as /usr/bin/python3, docs/security.md)"
        )
    closed = _closed_to_others(workdir)
    if closed is not None:
        raise SandboxError(
            f"worker users cannot enter the working directory (worker_dir): {closed}; it must be "
            "enterable by every user (docs/security.md)"
        )


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
