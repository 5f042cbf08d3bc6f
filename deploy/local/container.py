"""One container of the emulated cluster, as a container runtime would start it: run by the node agent
(`agent.py`) inside mount and UTS namespaces of its own (`unshare --mount --uts`), as root.

    python -I -m local_cluster.container CONTAINER.json

CONTAINER.json: {"argv": [...], "env": {...}, "mounts": {mountPath: host directory or file},
"workdir": str, "user": uid | null, "group": gid | null, "hostname": str, "readonly": [mountPath],
"cgroups": [path]}. It joins its cgroups first (every process it starts is in them).
The image's files (read-only) and each volume's directory are bind-mounted at their mount paths
(made if missing), so the container finds `/tmp`, its HOME and `/dev/shm` where its pod spec says and
shares them with no other pod, and the cluster's names at `/etc/hosts`; its hostname is the pod's;
then it becomes the pod's user and group (no supplementary groups) and executes the command with
exactly the pod's environment. Isolated mode (`-I`): nothing of the container's environment reaches
this step.
"""

from __future__ import annotations

import ctypes
import json
import os
import socket
import sys
from pathlib import Path

MS_RDONLY, MS_REMOUNT, MS_BIND = 1, 32, 4096
_libc = ctypes.CDLL(None, use_errno=True)


def _mount(source: str, target: str, flags: int) -> None:
    if _libc.mount(source.encode(), target.encode(), None, flags, None) != 0:
        error = ctypes.get_errno()
        raise OSError(error, f"mount {source} on {target}: {os.strerror(error)}")


def enter(spec: dict[str, object]) -> None:
    for group in spec.get("cgroups") or []:  # type: ignore[attr-defined]
        Path(group, "cgroup.procs").write_text(str(os.getpid()))  # its children follow
    mounts = spec.get("mounts") or {}
    assert isinstance(mounts, dict)
    # Every volume is held open before the first mount: a volume mounted at /tmp would otherwise hide
    # the others' directories when they live under /tmp themselves.
    held = {str(target): os.open(str(source), os.O_PATH) for target, source in mounts.items()}
    for target, descriptor in held.items():
        if Path(f"/proc/self/fd/{descriptor}").is_dir():
            Path(target).mkdir(parents=True, exist_ok=True)
        else:
            if not Path(target).exists():  # a file over a file: /etc/hosts, or one in an image's files
                Path(target).touch()
        # The kernel follows the descriptor to what it was opened on; mount(8) would resolve its name
        # again, under the volumes already mounted.
        _mount(f"/proc/self/fd/{descriptor}", target, MS_BIND)
        os.close(descriptor)
        if target in (spec.get("readonly") or []):  # type: ignore[operator]
            _mount("none", target, MS_BIND | MS_REMOUNT | MS_RDONLY)
    if spec.get("hostname"):  # its own UTS namespace: the pod's name for itself (gloo resolves it)
        socket.sethostname(str(spec["hostname"]))
    group, user = spec.get("group"), spec.get("user")
    if group is not None:
        os.setgroups([])
        os.setgid(int(group))  # type: ignore[call-overload]
    if user is not None:
        os.setuid(int(user))  # type: ignore[call-overload]
    os.chdir(str(spec.get("workdir") or "/"))
    argv = [str(part) for part in spec["argv"]]  # type: ignore[attr-defined]
    env = {str(k): str(v) for k, v in (spec.get("env") or {}).items()}  # type: ignore[attr-defined]
    os.execvpe(argv[0], argv, env)


if __name__ == "__main__":
    try:
        enter(json.loads(Path(sys.argv[1]).read_text()))
    except OSError as error:  # the kubelet's "CreateContainerError"
        print(f"container: {error}", file=sys.stderr)
        raise SystemExit(128) from None
