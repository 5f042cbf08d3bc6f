"""Becomes an unprivileged user, then runs a command as it (the local launcher's workers, when it is root).

    python -m gpuyard.launchers.privilege_drop UID GID -- COMMAND [ARG ...]

Drops every supplementary group, then the group, then the user; sets no_new_privs (a setuid binary
such as sudo cannot raise them again) and umask 077 (what the worker writes is its own), and execs
COMMAND in place: the same process, so signals and the exit status are the command's. Standard
library only: it runs before every worker.
"""

from __future__ import annotations

import ctypes
import os
import sys

_PR_SET_NO_NEW_PRIVS = 38


def drop(uid: int, gid: int) -> None:
    os.setgroups([])
    os.setgid(gid)
    os.setuid(uid)
    if (os.getuid(), os.geteuid(), os.getgid(), os.getegid()) != (uid, uid, gid, gid) or os.getgroups():
        raise OSError(f"still {os.getuid()}:{os.getgid()} {os.getgroups()} after dropping to {uid}:{gid}")
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS)")
    os.umask(0o077)


def main(argv: list[str]) -> int:
    if len(argv) < 4 or argv[2] != "--" or not (argv[0].isdigit() and argv[1].isdigit()):
        print(
            "usage: python -m gpuyard.launchers.privilege_drop UID GID -- COMMAND [ARG ...]", file=sys.stderr
        )
        return 2
    command = argv[3:]
    try:
        drop(int(argv[0]), int(argv[1]))
    except OSError as error:
        print(f"gpuyard: cannot drop privileges: {error}", file=sys.stderr, flush=True)
        return 126
    try:
        os.execvp(command[0], command)
    except OSError as error:
        print(f"gpuyard: cannot start {command[0]!r}: {error}", file=sys.stderr, flush=True)
    return 127


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
