"""Pausing for the fault suite (`pausing.py`): a whole process tree frozen at once and thawed, one
process stopped and continued. States are read after the kernel says the freeze is done: no timing."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from .pausing import Frozen, group_members, state, stopped, thaw_all


@pytest.fixture
def tree() -> Iterator[subprocess.Popen[bytes]]:
    """A shell leading its own process group, with a child that forks a grandchild."""
    process = subprocess.Popen(["sh", "-c", "sh -c 'sleep 300 & wait' & wait"], start_new_session=True)
    try:
        yield process
    finally:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def wait_members(group: int, count: int) -> list[int]:
    for _ in range(2000):
        if len(members := group_members([group])) >= count:
            return members
        os.sched_yield()
    raise AssertionError(f"group {group} has {group_members([group])}, expected {count} processes")


def test_a_frozen_tree_is_stopped_as_a_whole_and_runs_again_when_thawed(
    tree: subprocess.Popen[bytes],
) -> None:
    members = wait_members(tree.pid, 3)
    with Frozen([tree.pid]) as frozen:
        assert frozen.how == "cgroup v1 freezer", "this machine has the v1 freezer (docs/faults.md)"
        assert sorted(frozen.pids) == members
        # v1's freezer shows a frozen task as D (uninterruptible), v2's and SIGSTOP's as T
        assert {state(pid) for pid in members} <= {"D", "T"}
        cgroup = next(Path("/sys/fs/cgroup/freezer").glob(f"gpuyard-faults-{os.getpid()}-*"))
        assert (cgroup / "freezer.state").read_text().strip() == "FROZEN"
    assert not {state(pid) for pid in members} & {"D", "T"}
    assert not cgroup.exists(), "the freezer's group is removed once thawed"


def test_a_stopped_process_is_continued_however_the_pause_ends(tree: subprocess.Popen[bytes]) -> None:
    with pytest.raises(RuntimeError), stopped(tree.pid):
        assert state(tree.pid) == "T"
        raise RuntimeError("the fault failed half way")
    assert state(tree.pid) in ("S", "R")


def test_a_tree_left_frozen_by_an_interrupted_campaign_is_thawed_at_teardown(
    tree: subprocess.Popen[bytes],
) -> None:
    members = wait_members(tree.pid, 3)
    Frozen([tree.pid]).__enter__()  # never exited: the fault's thread died with its campaign
    assert {state(pid) for pid in members} <= {"D", "T"}
    (left,) = thaw_all()
    assert not left.exists()
    assert not {state(pid) for pid in members} & {"D", "T"}
