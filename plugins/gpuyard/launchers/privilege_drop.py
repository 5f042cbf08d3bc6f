"""How a worker becomes its team's unprivileged user: options for the exec that starts it.

The shim (root) starts the worker with `subprocess.Popen(command, env=job_env, **exec_options(uid, gid))`:
in the forked child, before the exec, every supplementary group is dropped, then the group, then the
user; umask 077 (what the worker writes is its own), then no_new_privs (a setuid binary such as sudo
cannot raise them again), each checked. The job's environment takes effect only at that exec, after
the drop: nothing a spec names (LD_PRELOAD, PYTHONPATH, ...) ever runs with the launcher's privileges.
"""

from __future__ import annotations

import ctypes
import functools
import os
from typing import Any

_PR_SET_NO_NEW_PRIVS = 38
_LIBC = ctypes.CDLL(None, use_errno=True)  # loaded here, not in the forked child


def exec_options(uid: int, gid: int) -> dict[str, Any]:
    """`subprocess.Popen` keyword arguments that start the command as `uid`:`gid` and nothing more."""
    return {
        "user": uid,
        "group": gid,
        "extra_groups": [],
        "umask": 0o077,
        "preexec_fn": functools.partial(_seal, uid, gid),  # runs after the drop, before the exec
    }


def _seal(uid: int, gid: int) -> None:
    """In the child, after Popen dropped the groups and the user: check, then forbid regaining them."""
    if (os.getuid(), os.geteuid(), os.getgid(), os.getegid()) != (uid, uid, gid, gid) or os.getgroups():
        raise OSError(f"still {os.getuid()}:{os.getgid()} {os.getgroups()} after dropping to {uid}:{gid}")
    if _LIBC.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS)")
