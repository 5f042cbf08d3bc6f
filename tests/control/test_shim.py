"""The shim records its worker's exit status even when the node's disk filled up while it ran: an
adopted worker's launcher (not its parent) has no other way to learn how it ended."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from faults.backends import SmallDisk

FILL = (
    "import os, sys\n"
    "with open(sys.argv[1], 'ab', buffering=0) as f:\n"
    "    try:\n"
    "        while True: f.write(b'x' * 65536)\n"
    "    except OSError: pass\n"
    "try:\n"
    "    open(sys.argv[1] + '.probe', 'w').write('x' * 8192)\n"
    "except OSError: sys.exit(int(sys.argv[2]))\n"
    "sys.exit(99)  # the disk was not full: the test proves nothing\n"
)


@pytest.mark.parametrize("code", [0, 3])
def test_a_disk_that_filled_while_the_worker_ran_still_takes_its_exit_status(
    small_disk: SmallDisk, code: int
) -> None:
    exit_file = small_disk.path / "rank0.exit"
    shim = subprocess.run(
        [
            sys.executable,
            "-I",
            "-m",
            "gpuyard.launchers.shim",
            str(exit_file),
            "--",
            sys.executable,
            "-c",
            FILL,
            str(small_disk.path / "ballast"),
            str(code),
        ],
        input=json.dumps({"PATH": "/usr/bin:/bin"}),  # the worker's environment, as the launcher hands it
        text=True,
        timeout=60,
    )
    assert shim.returncode == code  # the worker did fill the disk, then exited with `code`
    assert int(exit_file.read_text()) == code
    assert not exit_file.with_suffix(".tmp").exists()
