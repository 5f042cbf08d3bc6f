"""benchmarks/time_to_resume.py's pure parts: how a resume is split into phases, and the report."""

from __future__ import annotations

import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import time_to_resume as ttr


def test_phases_end_at_their_marks_and_add_up_to_the_time_to_resume() -> None:
    worker = [13.0, 15.0, 15.5, 16.0, 16.25]  # rank 0: start, imported, joined, restore began, restored
    phases = ttr.phase_marks(100.0, 102.0, 103.0, None, [100 + t for t in worker], 117.0)
    assert phases == {
        "end": 2.0,
        "place": 1.0,
        "launch": 10.0,
        "import": 2.0,
        "join": 0.5,
        "setup": 0.5,
        "restore": 0.25,
        "step": 0.75,
    }
    assert math.isclose(sum(phases.values()), 17.0)


def test_a_pods_process_that_starts_the_ranks_is_a_phase_of_its_own() -> None:
    worker = [108.0, 110.0, 111.0, 112.0, 113.0]
    phases = ttr.phase_marks(100.0, 102.0, 103.0, 105.0, worker, 114.0)
    assert (phases["launch"], phases["node"]) == (2.0, 3.0)  # the pod's process, then rank 0's
    assert math.isclose(sum(phases.values()), 14.0)
    assert list(phases) == [p for p in ttr.PHASES if p in phases]


def test_a_moment_not_seen_leaves_out_the_phases_on_either_side() -> None:
    phases = ttr.phase_marks(0.0, None, 3.0, None, [4.0, 5.0, 6.0, 7.0, None], 9.0)
    assert set(phases) == {"launch", "import", "join", "setup"}  # no end, place, restore or step


def test_the_report_gives_p99_per_kind_and_names_the_phases_of_a_missed_goal() -> None:
    def resumed(kind: str, number: int, total: float, end: float) -> ttr.Measurement:
        phases = {"end": end, "launch": total - end - 0.5, "restore": 0.5}
        return ttr.Measurement(kind, number, f"job-{kind}-{number}", total, phases)

    measurements = [resumed("preempt", n, t, 1.0) for n, t in ((1, 4.0), (2, 6.0), (3, 5.0))]
    measurements += [resumed("leader_loss", 1, 40.0, 30.0)]
    measurements += [ttr.Measurement("crash", 1, "job-crash-1", None, notes=["old attempt RUNNING"])]
    report = ttr.report(measurements, lease_s=10)
    assert report.splitlines()[-1] == (
        "RESULT preempt_p99_s=6.00 crash_p99_s=inf node_loss_p99_s=nan leader_loss_p99_s=40.00 "
        "lease_s=10 restore_s=0.500"
    )
    assert "leader_loss over its goal by 14.50 s; most time in end (30.00 s median)" in report
    assert "crash not resumed: old attempt RUNNING" in report
