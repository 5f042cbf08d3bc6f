"""Data has a size and a place: what a start stages, the score that prefers the data's site, and a move
refused until it pays, in the cycle and in the simulator alike."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from gpuyard.domain.feasibility import TeamQuota
from gpuyard.domain.model import Job
from gpuyard.domain.sites import (
    Held,
    Wan,
    copy_source,
    held_share,
    least_copied,
    move_pays,
    staged_bytes,
    staging_s,
)
from gpuyard.domain.spec import parse_spec
from gpuyard.domain.states import JobState
from gpuyard.scheduler.cycle import NO_ROOM_AT_SITE, run_cycle
from gpuyard.scheduler.inputs import pending_job
from gpuyard.scheduler.plugins import data_locality
from gpuyard.scheduler.policy import POLICIES
from gpuyard.scheduler.snapshot import ClusterState, FleetIndex, PendingJob
from gpuyard.sim.run import simulate
from gpuyard.sim.sites import SiteEvent, SiteModel

from .test_sites import SEVEN_B, T0, WAN, job, quiet, two_sites

NOW = datetime(2026, 12, 6, tzinfo=UTC)
DATA = 100e9  # 100 GB: 80 s at 10 Gbit/s, and 4 round trips of 40 ms
STAGE_S = 0.16 + 80.0


def test_a_start_stages_the_bytes_its_site_lacks_at_the_links_rate() -> None:
    data = (Held(40e9, ("a",)), Held(10e9, ("a", "b")), Held(5e9))  # the last: every site reaches it
    assert [staged_bytes(site, data) for site in ("a", "b", "c")] == [0.0, 40e9, 50e9]
    assert staging_s("a", data, WAN) == 0.0  # nothing to copy: no round trips either
    assert staging_s("b", data, WAN) == pytest.approx(0.16 + 32.0)
    assert staging_s("b", data, WAN, sharing=2) == pytest.approx(0.16 + 64.0)  # half the link
    assert staging_s("b", data, Wan(1.0, 0.04, 0.02)) == pytest.approx(0.16 + 320.0)
    assert (copy_source("a", data), copy_source("c", data)) == (None, "a")
    # Where a start copies least (ties: the first named), and the share of the data found there.
    assert least_copied(("c", "b", "a"), data) == "a" and least_copied((), data) is None
    assert [held_share(site, data) for site in ("a", "b")] == [1.0, pytest.approx(15 / 55)]
    assert held_share("b", (Held(0, ("a",)), Held(0, ("b",)))) == 0.5  # no sizes: by count
    # A checkpoint is held like data: a move beyond a start at its own site pays what it adds.
    assert not move_pays(waited_s=4.0, copy_s=50.0, stay_s=45.0)
    assert move_pays(waited_s=5.0, copy_s=50.0, stay_s=45.0)
    with pytest.raises(ValueError, match="held bytes must be a finite number >= 0, got -1"):
        Held(-1, ("a",))


def queued(waited_s: float, **site: object) -> PendingJob:
    """A job of 8 GPUs of team t queued `waited_s` ago, with `site` (its data, checkpoint, ...)."""
    return PendingJob(
        id="j",
        team="t",
        gpus=8,
        nodes=1,
        gpu_types=(),
        priority=0,
        preemptible=False,
        submitted_at=NOW - timedelta(hours=5),
        queued_at=NOW - timedelta(seconds=waited_s),
        **site,  # type: ignore[arg-type]
    )


def state(wan: Wan | None, full: tuple[str, ...] = ()) -> ClusterState:
    """Two sites of one 8-GPU node each; the sites in `full` have no room."""
    return ClusterState(
        index=FleetIndex(two_sites()),
        free={f"{s}-n0000": set() if s in full else set(range(8)) for s in ("a", "b")},
        quotas={"t": TeamQuota(gpu_quota=16)},
        wan=wan,
    )


def test_placement_prefers_the_site_holding_the_data() -> None:
    at_b = queued(0.0, data=(Held(DATA, ("b",)),))
    snapshot = state(None)
    a, b = (snapshot.nodes[f"{s}-n0000"] for s in ("a", "b"))
    assert (data_locality(at_b, [a], snapshot), data_locality(at_b, [b], snapshot)) == (0.0, 100.0)
    assert data_locality(queued(0.0), [a], snapshot) == 100.0  # no data: every site alike
    # Both sites empty and alike but for the data: `any` (one scored search) and the service's
    # gpuyard (no WAN) start it at b, where without data the first best fit, a, wins.
    for policy in ("fifo", "gpuyard"):
        for job_, site in ((at_b, "b"), (queued(0.0), "a")):
            placed = run_cycle([job_], state(None), NOW, POLICIES[policy]).placed
            assert [p.placement.site for p in placed] == [site]


@pytest.mark.parametrize(
    ("waited_s", "wan", "placed_at"),
    [
        (80.0, WAN, None),  # staging 100 GB takes 80.16 s: waiting so far is cheaper
        (80.2, WAN, "b"),  # now the wait beats the staging: starts at b
        (80.2, Wan(1.0, 0.04, 0.02), None),  # at 1 Gbit/s staging takes 800 s
    ],
)
def test_a_start_away_from_the_data_is_refused_until_the_wait_beats_its_staging(
    waited_s: float, wan: Wan, placed_at: str | None
) -> None:
    job_ = queued(waited_s, data=(Held(DATA, ("a",)),))
    assert job_.own_site == "a"
    result = run_cycle([job_], state(wan, full=("a",)), NOW, POLICIES["gpuyard"])
    assert [p.placement.site for p in result.placed] == ([placed_at] if placed_at else [])
    if placed_at is None:
        assert result.waiting == {"j": NO_ROOM_AT_SITE}
    assert run_cycle([job_], state(wan, full=("a",)), NOW, POLICIES["stay"]).placed == []


def test_checkpoint_and_data_are_charged_by_one_rule() -> None:
    """A 16 GB checkpoint at b and 100 GB of data at a: a start at a copies less (the checkpoint),
    so a is its own site; a move to b adds the data's staging less the checkpoint's copy: 67.2 s."""
    needs = {"checkpoint_site": "b", "checkpoint_bytes": 16e9, "data": (Held(DATA, ("a",)),)}
    assert queued(0.0, **needs).own_site == "a"
    for waited_s, placed_at in ((67.0, None), (67.3, "b")):
        result = run_cycle([queued(waited_s, **needs)], state(WAN, full=("a",)), NOW, POLICIES["gpuyard"])
        assert [p.placement.site for p in result.placed] == ([placed_at] if placed_at else [])
    # A job may only run at b: b is its own site, whatever it stages there.
    pinned = queued(0.0, sites=("b",), data=(Held(DATA, ("a",)),))
    assert pinned.own_site is None
    assert queued(0.0, sites=("b",), home_site="b", data=(Held(DATA, ("a",)),)).own_site == "b"


def test_the_service_reads_what_a_job_reads_from_its_spec() -> None:
    spec = parse_spec(
        {
            "name": "x",
            "team": "t",
            "image": "i",
            "command": ["c"],
            "data": [
                {"uri": "s3://east/in/", "size": "40G", "sites": ["a"]},
                {"uri": "s3://lake/ref/", "sites": ["a", "b"]},  # no size: preferred, not charged
                {"uri": "s3://east/out/", "access": "write", "size": "1T", "sites": ["a"]},  # written
                {"uri": "s3://lake/any/", "size": "1T"},  # every site reaches it
            ],
        }
    )
    stored = Job("j", "t", "x", spec, JobState.PENDING, NOW, NOW, "t")
    assert pending_job(stored).data == (Held(40e9, ("a",)), Held(0, ("a", "b")))


def test_the_simulator_charges_a_move_its_checkpoint_and_the_data_the_site_lacks() -> None:
    """The team's data (100 GB) lies at its home, a; a is lost at 1,000 s for a day. The job resumes at
    b once its wait beats the copy of its checkpoint (112 GB) and its data: 212 GB, 169.76 s."""
    event = SiteEvent("a", T0 + timedelta(seconds=1000), T0 + timedelta(seconds=100_000), 1.0)
    model = SiteModel(WAN, {"t": "a"}, events=(event,), staging_bytes=DATA)
    result = simulate([job(0, 0.0, 10_000.0, 8, "t")], two_sites(), "gpuyard", quiet(model))
    first, resumed = result.attempts
    assert first.start_s == 0.0 and first.restore_s == 0.0  # at home: nothing staged
    copy = 0.16 + (SEVEN_B + DATA) * 8 / 10e9
    assert resumed.start_s == pytest.approx(1000.0 + copy, abs=1e-3)
    assert resumed.restore_s == pytest.approx(copy + 60.0)
    totals = result.totals
    assert (totals.moves, totals.checkpoint_moves) == (1, 1)
    assert totals.bytes_moved == SEVEN_B + DATA
    assert totals.egress_usd == pytest.approx((SEVEN_B + DATA) / 1e9 * 0.02)
