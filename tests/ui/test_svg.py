"""The page's pictures as pure functions: what each mark says about a node, a GPU and an attempt."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from gpuyard_provider.ui import pages, svg

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


def _node(
    name: str, free: int, leases: list[dict[str, object]], taints: tuple[str, ...] = ()
) -> dict[str, object]:
    return {
        "name": name,
        "site": "s1",
        "cluster": "c1",
        "domain": "d0",
        "gpu_type": "A100",
        "gpus": 4,
        "free_gpus": free,
        "leases": leases,
        "taints": list(taints),
    }


def test_the_grid_tells_free_own_others_and_unhealthy_gpus() -> None:
    mine = {"gpu": 1, "job_id": "job-1", "job_name": "train <7b>", "team": "a", "attempt_id": "att-1"}
    grid = svg.fleet_grid(
        [
            _node("n0", 1, [mine]),  # 3 leased: one by the caller's job, two by another team
            _node("n1", 4, [], ("node.kubernetes.io/not-ready:NoSchedule",)),
            _node("n2", 4, [], ("gpuyard.io/spot:NoSchedule",)),
        ]
    )
    assert grid.count('class="gpu leased"') == 3 and grid.count('data-job="job-1"') == 1
    assert "train &lt;7b&gt;" in grid  # escaped
    assert grid.count("leased by another team") == 2
    assert grid.count('class="gpu free unhealthy"') == 4  # the not-ready node only
    assert grid.count('class="gpu free"') == 1 + 4  # n0's free one and the spot node's
    assert 'stroke-dasharray="3 2"' in grid  # the spot node, tainted but healthy


def test_the_timeline_marks_checkpoints_notices_and_how_each_attempt_ended() -> None:
    t0 = NOW - timedelta(minutes=10)
    at = lambda minutes: (t0 + timedelta(minutes=minutes)).isoformat()  # noqa: E731
    job = {
        "id": "job-1",
        "state": "RUNNING",
        "created_at": at(0),
        "attempts": [
            {
                "id": "a1",
                "number": 1,
                "state": "PREEMPTED",
                "created_at": at(1),
                "started_at": at(2),
                "ended_at": at(5),
                "placement": {"nodes": [{"node": "n0", "gpus": [0]}]},
                "checkpoint_step": 20,
                "progress_lost_s": 3.0,
            },
            {
                "id": "a2",
                "number": 2,
                "state": "RUNNING",
                "created_at": at(6),
                "ended_at": None,
                "placement": {"nodes": [{"node": "n1", "gpus": [0]}]},
                "checkpoint_step": 30,
            },
        ],
        "events": [
            {"seq": 1, "type": "attempt.checkpointed", "attempt_id": "a1", "data": {"step": 20}, "at": at(3)},
            # a heartbeat repeats it; attempt 2 then saves its own step 30 (it resumed from 20)
            {
                "seq": 2,
                "type": "attempt.checkpointed",
                "attempt_id": "a1",
                "data": {"step": 20},
                "at": at(3.5),
            },
            {"seq": 9, "type": "attempt.checkpointed", "attempt_id": "a2", "data": {"step": 30}, "at": at(8)},
            {
                "seq": 2,
                "type": "attempt.stop_requested",
                "attempt_id": "a1",
                "data": {"kind": "preempt", "why": "preempted by ops"},
                "at": at(4),
            },
            {"seq": 3, "type": "attempt.preempted", "attempt_id": "a1", "data": {}, "at": at(5)},
        ],
    }
    drawn = svg.timeline(job, NOW)
    assert (
        'data-attempt="a1" data-state="PREEMPTED"' in drawn
        and 'data-attempt="a2" data-state="RUNNING"' in drawn
    )
    assert drawn.count('class="checkpoint"') == 2 and 'data-kind="preempt"' in drawn
    assert (
        'class="end-label" data-state="PREEMPTED"' in drawn and 'end-label" data-state="RUNNING' not in drawn
    )
    assert drawn.count('class="wait"') == 2  # before its first attempt, and between the two
    assert drawn.count('class="launching"') == 1  # a1 was placed at 1 min and ran from 2 min
    assert "resumed from step 20" in drawn and "3 s of work lost" in drawn


def test_a_chart_breaks_its_line_at_gaps_and_says_when_it_is_empty() -> None:
    points = [(NOW + timedelta(hours=k), v) for k, v in enumerate([0.5, None, 0.2, 0.4])]
    chart = svg.line_chart("goodput", {"total": points}, percent=True)
    assert chart.count("<polyline") == 1 and chart.count("<circle") == 1  # a lone point before the gap
    assert "100%" in chart
    assert "no data yet" in svg.line_chart("cost", {})
    known = svg.colours(["platform", "a", "a"])
    assert len(set(known.values())) == 2  # a colour each ('a' and 'platform' share one by hash)
    both = svg.line_chart("util", {"total": points, "a": points}, team_colours=known)
    assert f'stroke="{known["a"]}"' in both and 'stroke-dasharray="5 3"' in both  # the total dashed
    assert both.rindex('data-line="total"') > both.rindex('data-line="a"')  # and drawn on top
    assert "idle GPUs" in pages.figures(
        "/gpuyard",
        {
            "hours": 1.0,
            "total": [{"end": NOW.isoformat(), **dict.fromkeys(f for f, _, _ in pages.FIGURES)}],
            "teams": {},
        },
        {},
    )
