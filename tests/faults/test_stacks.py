"""What a leftover worker was doing (stacks.py), on real processes: a Python worker blocked in a known
function tells its stacks; a process that does not catch SIGUSR1 is described and left alive."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from .stacks import catches_sigusr1, describe

BLOCKED = """
import faulthandler, signal, sys, threading
faulthandler.register(signal.SIGUSR1, all_threads=True)

def waiting_for_a_peer_that_never_comes():
    print("ready", flush=True)
    threading.Event().wait()

waiting_for_a_peer_that_never_comes()
"""


@pytest.fixture
def started(tmp_path: Path) -> Iterator[list[subprocess.Popen[bytes]]]:
    processes: list[subprocess.Popen[bytes]] = []
    yield processes
    for process in processes:
        process.kill()
        process.wait()


def test_a_blocked_worker_tells_where_it_waits_and_a_plain_process_is_left_alive(
    tmp_path: Path, started: list[subprocess.Popen[bytes]]
) -> None:
    log = (tmp_path / "worker.log").open("wb")
    worker = subprocess.Popen([sys.executable, "-c", BLOCKED], stdout=subprocess.PIPE, stderr=log)
    plain = subprocess.Popen(["sleep", "300"], stderr=(tmp_path / "sleep.log").open("wb"))
    started.extend([worker, plain])
    assert worker.stdout is not None and worker.stdout.readline() == b"ready\n"  # the handler is in
    assert catches_sigusr1(worker.pid) and not catches_sigusr1(plain.pid)

    said = describe([worker.pid, plain.pid])

    assert f"pid {worker.pid} state S" in said and f"pid {plain.pid} state S" in said
    assert "waiting_for_a_peer_that_never_comes" in said, said
    assert "sleep 300" in said
    assert worker.poll() is None and plain.poll() is None, "describing a process never ends it"
