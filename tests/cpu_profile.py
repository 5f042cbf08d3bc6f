"""Where the suite's CPU goes (the suite is CPU-bound on 2 cores: its wall time follows its CPU).

With `GPUYARD_CPU_PROFILE=FILE` set, `tests/conftest.py` registers `CpuProfile`: each worker appends
one JSON line per test to FILE, with the CPU seconds its process and everything it started spent
during the test (setup, call and teardown: a module's fixtures count for the test that started or
stopped them), the test's wall time, its pytest-xdist worker and when it ended. `python
tests/cpu_profile.py FILE` sums them by module, then says when each worker ran out of tests and
which tests ended last: the suite's tail, where fewer workers than cores are busy.

A process started by the test counts while it lives and once its parent reaped it; one reparented
to init before it was reaped, or alive when the test began and gone unreaped by its end, is
miscounted (the suite's servers are reaped by their fixtures).
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest


def spent_s() -> float:
    """CPU seconds of this process and of every descendant, their reaped children's included."""
    me = psutil.Process()
    total = sum(me.cpu_times()[:4])  # user, system, and the reaped children's
    for child in me.children(recursive=True):
        with contextlib.suppress(psutil.Error):
            total += sum(child.cpu_times()[:4])
    return total


class CpuProfile:
    def __init__(self, path: Path):
        self.path = path

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item) -> Iterator[None]:
        began, cpu = time.monotonic(), spent_s()
        yield
        line = {"test": item.nodeid, "cpu_s": spent_s() - cpu, "wall_s": time.monotonic() - began}
        line |= {"worker": os.environ.get("PYTEST_XDIST_WORKER", "main"), "ended": time.time()}
        with self.path.open("a") as out:
            out.write(json.dumps(line) + "\n")


def by_module(lines: list[dict[str, object]]) -> list[tuple[str, float, float, int]]:
    """(module, CPU s, wall s, tests), the costliest first."""
    sums: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0])
    for line in lines:
        module = str(line["test"]).split("::")[0]
        sums[module][0] += float(line["cpu_s"])  # type: ignore[arg-type]
        sums[module][1] += float(line["wall_s"])  # type: ignore[arg-type]
        sums[module][2] += 1
    return sorted(((m, c, w, int(n)) for m, (c, w, n) in sums.items()), key=lambda row: -row[1])


def main(path: str) -> None:
    lines = [json.loads(text) for text in Path(path).read_text().splitlines() if text]
    rows = by_module(lines)
    total = sum(row[1] for row in rows)
    print(f"{len(lines)} tests, {total:.0f} CPU-s in all")
    print(f"{'CPU s':>8} {'share':>6} {'wall s':>8} {'tests':>5}  module")
    for module, cpu, wall, count in rows:
        print(f"{cpu:8.1f} {cpu / total:6.1%} {wall:8.1f} {count:5d}  {module}")
    timed = [line for line in lines if "ended" in line]
    if not timed:
        return
    start = min(float(line["ended"]) - float(line["wall_s"]) for line in timed)  # type: ignore[arg-type]
    last: dict[str, float] = defaultdict(float)
    for line in timed:
        last[str(line["worker"])] = max(last[str(line["worker"])], float(line["ended"]) - start)  # type: ignore[arg-type]
    print(
        "workers out of tests at (s after the first test began): "
        + ", ".join(f"{worker} {at:.0f}" for worker, at in sorted(last.items(), key=lambda item: item[1]))
    )
    print("the last tests to end:")
    for line in sorted(timed, key=lambda line: -float(line["ended"]))[:8]:  # type: ignore[arg-type]
        ended = float(line["ended"]) - start  # type: ignore[arg-type]
        print(f"  {ended:6.0f} s  {float(line['wall_s']):6.1f} s long  {line['worker']}  {line['test']}")  # type: ignore[arg-type]


if __name__ == "__main__":
    main(sys.argv[1])
