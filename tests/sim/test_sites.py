"""Sites: the move rule, what a move costs, site events, and `stay` never crossing sites."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from gpuyard.domain.feasibility import TeamQuota
from gpuyard.domain.fleet import Fleet
from gpuyard.domain.sites import Wan, egress_usd, move_pays, transfer_s
from gpuyard.scheduler.cycle import NO_ROOM_AT_SITE, run_cycle
from gpuyard.scheduler.policy import POLICIES
from gpuyard.scheduler.snapshot import ClusterState, FleetIndex, PendingJob
from gpuyard.sim.engine import LeaseRecord, SimConfig
from gpuyard.sim.metrics import summarize
from gpuyard.sim.run import simulate
from gpuyard.sim.sites import SiteEvent, SiteModel, home_sites, parameters, peak_overlap, site_fleet
from gpuyard.sim.trace import TraceJob

from .test_simulator import LeaseChecker

T0 = datetime(2017, 10, 1, tzinfo=UTC)
WAN = Wan(gbit_s=10.0, rtt_s=0.04, egress_usd_per_gb=0.02)
SEVEN_B = 16 * 7e9  # the checkpoint of an 8-GPU job: 112 GB
COPY_7B = 4 * 0.04 + SEVEN_B * 8 / 10e9  # 89.76 s at 10 Gbit/s


def job(i: int, at_s: float, duration_s: float, gpus: int, team: str) -> TraceJob:
    return TraceJob(f"j{i:04d}", team, T0 + timedelta(seconds=at_s), duration_s, gpus)


def two_sites(nodes_per_site: int = 1) -> Fleet:
    return site_fleet(("a", "b"), nodes_per_site, nodes_per_domain=1, preemptible_nodes=0)


class Watch(LeaseChecker):
    """Checks the leases (exclusive, gangs in one domain) and keeps them."""

    def __init__(self, fleet: Fleet):
        super().__init__(fleet)
        self.records: list[LeaseRecord] = []

    def __call__(self, record: LeaseRecord) -> None:
        self.records.append(record)
        super().__call__(record)


def quiet(model: SiteModel) -> SimConfig:
    """No spot interruptions; a checkpoint every 500 s of work (30 s each), restore 60 s."""
    return SimConfig(preemptible_mtbi_s=None, checkpoint_interval=500.0, sites=model)


# -- the pure rules ---------------------------------------------------------------------------------


def test_a_copy_costs_its_round_trips_and_bytes_and_moves_once_the_wait_reaches_it() -> None:
    assert transfer_s(0, WAN) == 0.0  # nothing to copy: no round trips either
    assert transfer_s(SEVEN_B, WAN) == pytest.approx(COPY_7B)
    assert transfer_s(SEVEN_B, Wan(1.0, 0.04, 0.02)) == pytest.approx(0.16 + 896.0)
    assert transfer_s(SEVEN_B, WAN, sharing=2) == pytest.approx(0.16 + 2 * 89.6)  # half the link
    assert egress_usd(SEVEN_B, WAN) == pytest.approx(2.24)
    assert not move_pays(waited_s=89.0, copy_s=COPY_7B)  # the saving does not beat the copy yet
    assert move_pays(waited_s=90.0, copy_s=COPY_7B)
    assert move_pays(waited_s=0.0, copy_s=0.0)  # nothing to copy: moves as soon as it waits
    with pytest.raises(ValueError, match="bandwidth"):
        Wan(gbit_s=0.0, rtt_s=0.04, egress_usd_per_gb=0.02)
    with pytest.raises(ValueError, match="negative size"):
        transfer_s(-1.0, WAN)


def test_parameters_step_down_the_table_and_teams_split_by_a_stated_rule() -> None:
    assert [parameters(g) for g in (1, 2, 3, 8, 12, 32, 64, 128)] == [
        1e9, 2e9, 2e9, 7e9, 7e9, 30e9, 70e9, 70e9
    ]  # fmt: skip
    with pytest.raises(ValueError, match="at least 1 GPU"):
        parameters(0)
    with pytest.raises(ValueError, match="rising GPU counts"):
        SiteModel(WAN, {}, params_by_gpus=((8, 7e9), (1, 1e9)))
    trace = [
        job(0, 0, 1000, 8, "big"),
        job(1, 0, 600, 8, "mid"),
        job(2, 0, 500, 8, "low"),
        job(3, 0, 10, 1, "x"),
    ]
    # By GPU-time, largest first, each to the site with the least so far: big 8,000 GPU-s to a, mid
    # 4,800 to b, low 4,000 to b (8,800), x 10 to a.
    assert home_sites(trace, ("a", "b")) == {"big": "a", "mid": "b", "low": "b", "x": "a"}
    assert home_sites(trace, ("a", "b"), "alternate") == {"big": "a", "low": "b", "mid": "a", "x": "b"}
    with pytest.raises(ValueError, match="unknown split rule 'nearest'"):
        home_sites(trace, ("a", "b"), "nearest")
    assert peak_overlap([(0, 2), (1, 3), (2, 4), (5, 6)]) == 2  # one ending as another starts: not both
    with pytest.raises(ValueError, match="team 'nobody' has no home site"):
        SiteModel(WAN, {"x": "a"}).home_of("nobody")


# -- the cycle's site rules -------------------------------------------------------------------------


def pending_at_a(waited_s: float, now: datetime) -> PendingJob:
    """A job of 8 GPUs whose checkpoint (7B parameters) lies at site a, queued `waited_s` ago."""
    return PendingJob(
        id="j",
        team="t",
        gpus=8,
        nodes=1,
        gpu_types=(),
        priority=0,
        preemptible=True,
        submitted_at=now - timedelta(hours=5),
        checkpoint_site="a",
        home_site="a",
        checkpoint_bytes=SEVEN_B,
        queued_at=now - timedelta(seconds=waited_s),
    )


@pytest.mark.parametrize(
    ("policy", "waited_s", "wan", "placed_at"),
    [
        ("gpuyard", 89.0, WAN, None),  # the wait so far is under the copy: it waits for a
        ("gpuyard", 90.0, WAN, "b"),  # now it beats the copy: resumes at b
        ("gpuyard", 90.0, Wan(1.0, 0.04, 0.02), None),  # at 1 Gbit/s the copy takes 896 s
        ("gpuyard", 0.0, None, "b"),  # no WAN modelled (the service today): any site, as before
        ("stay", 1e6, WAN, None),  # stay waits for its site however long
    ],
)
def test_a_job_moves_only_when_its_wait_beats_the_copy(
    policy: str, waited_s: float, wan: Wan | None, placed_at: str | None
) -> None:
    fleet = two_sites()
    state = ClusterState(
        index=FleetIndex(fleet),
        free={"a-n0000": set(), "b-n0000": set(range(8))},  # site a is full
        quotas={"t": TeamQuota(gpu_quota=16)},
        wan=wan,
    )
    now = datetime(2026, 12, 6, tzinfo=UTC)
    result = run_cycle([pending_at_a(waited_s, now)], state, now, POLICIES[policy])
    assert [p.placement.site for p in result.placed] == ([placed_at] if placed_at else [])
    if placed_at is None and wan is not None:
        assert result.waiting == {"j": NO_ROOM_AT_SITE}


# -- the engine: moves charged, site events, stay -----------------------------------------------------


def test_a_move_charges_its_copy_before_the_job_resumes_and_counts_bytes_and_egress() -> None:
    """Site a loses its node at 1,000 s for a day; the job resumes at b once its wait beats the copy."""
    fleet = two_sites()
    event = SiteEvent("a", T0 + timedelta(seconds=1000), T0 + timedelta(seconds=100_000), 1.0)
    trace = [job(0, 0.0, 10_000.0, 8, "t")]
    finished = {}
    for policy, wan in (("gpuyard", WAN), ("gpuyard", Wan(1.0, 0.04, 0.02)), ("stay", WAN)):
        model = SiteModel(wan, {"t": "a"}, events=(event,))
        result = simulate(trace, fleet, policy, quiet(model))
        lost, resumed = result.attempts
        # Checkpoints every 500 s of work (30 s each): 500 s saved at 1,000 s, 470 s lost.
        assert lost.outcome == "LOST" and lost.end_s == 1000.0 and lost.lost_s == pytest.approx(470.0)
        (done,) = result.jobs
        finished[(policy, wan.gbit_s)] = done.finished_s
        totals = result.totals
        if policy == "stay":
            assert totals.moves == 0 and totals.bytes_moved == 0 and resumed.start_s == 100_000.0
            assert done.finished_s == pytest.approx(100_000.0 + 60.0 + 9_500.0 + 18 * 30.0)
            continue
        copy = transfer_s(SEVEN_B, wan)
        assert resumed.start_s == pytest.approx(1000.0 + copy, abs=1e-3)  # waited as long as the copy
        # The copy, then the restore, with the GPUs at b held: 9,500 s of work and 18 checkpoints left.
        assert resumed.restore_s == pytest.approx(copy + 60.0)
        assert done.finished_s == pytest.approx(resumed.start_s + copy + 60.0 + 9_500.0 + 18 * 30.0)
        assert (totals.moves, totals.checkpoint_moves) == (1, 1)
        assert totals.bytes_moved == SEVEN_B and totals.egress_usd == pytest.approx(2.24)
        assert totals.transfer_s == pytest.approx(copy)
        assert totals.copies == [(resumed.start_s, pytest.approx(resumed.start_s + copy))]
        assert summarize(result).peak_copies == 1
    assert finished[("gpuyard", 10.0)] < finished[("gpuyard", 1.0)] < finished[("stay", 10.0)]


def test_copies_under_way_share_the_link_and_a_copy_cut_short_leaves_the_checkpoint_where_it_was() -> None:
    fleet = two_sites(nodes_per_site=2)
    at = T0 + timedelta(seconds=1000)
    a_down = SiteEvent("a", at, T0 + timedelta(days=2), 1.0)
    trace = [job(0, 0.0, 10_000.0, 8, "t"), job(1, 0.0, 10_000.0, 8, "t")]
    shared = simulate(trace, fleet, "gpuyard", quiet(SiteModel(WAN, {"t": "a"}, events=(a_down,))))
    resumed = [a for a in shared.attempts if a.outcome == "SUCCEEDED"]
    # Both move in the cycle at 1,089.76 s (each alone on the link as that snapshot saw it), and
    # then send at 5 Gbit/s each: 179.2 s, and the round trips.
    assert [a.start_s for a in resumed] == [pytest.approx(1000.0 + COPY_7B, abs=1e-3)] * 2
    assert [a.restore_s for a in resumed] == [pytest.approx(2 * SEVEN_B * 8 / 10e9 + 0.16 + 60.0)] * 2
    assert shared.totals.bytes_moved == pytest.approx(2 * SEVEN_B)
    # Site b goes down 10.24 s into the copy of a lone job: 12.8 GB sent, the checkpoint still at a;
    # back at 1,200 s, the job (waiting since 1,100 s, past its copy) copies it again, whole.
    b_down = SiteEvent("b", T0 + timedelta(seconds=1100), T0 + timedelta(seconds=1200), 1.0)
    model = SiteModel(WAN, {"t": "a"}, events=(a_down, b_down))
    cut = simulate(trace[:1], two_sites(), "gpuyard", quiet(model))
    _, cut_short, done = cut.attempts
    assert cut_short.outcome == "LOST" and (cut_short.start_s, cut_short.end_s) == (
        pytest.approx(1000.0 + COPY_7B, abs=1e-3),
        1100.0,
    )
    assert done.start_s == 1200.0 and done.restore_s == pytest.approx(COPY_7B + 60.0)
    assert (cut.totals.moves, cut.totals.checkpoint_moves) == (2, 2)
    sent = (1100.0 - cut_short.start_s) * 10e9 / 8
    assert cut.totals.bytes_moved == pytest.approx(sent + SEVEN_B)
    assert cut.totals.egress_usd == pytest.approx((sent + SEVEN_B) / 1e9 * 0.02)


def test_a_job_not_started_moves_at_once_or_after_its_staging_copy() -> None:
    fleet = two_sites()
    trace = [job(0, 0.0, 5_000.0, 8, "t"), job(1, 100.0, 1_000.0, 8, "t")]  # site a holds one
    for staging, starts_s in ((0.0, 100.0), (1e9, 100.0 + 0.16 + 0.8)):
        model = SiteModel(WAN, {"t": "a"}, staging_bytes=staging)
        result = simulate(trace, fleet, "gpuyard", quiet(model))
        second = next(a for a in result.attempts if a.job_id == "j0001")
        assert second.start_s == pytest.approx(starts_s, abs=1e-3)
        totals = result.totals
        assert (totals.moves, totals.checkpoint_moves, totals.bytes_moved) == (1, 0, staging)
        assert totals.egress_usd == pytest.approx(staging / 1e9 * 0.02)


def test_a_site_event_takes_part_of_a_site_down_for_its_window_then_gives_it_back() -> None:
    fleet = two_sites(nodes_per_site=2)
    event = SiteEvent("b", T0 + timedelta(seconds=1000), T0 + timedelta(seconds=5000), 0.5)
    assert event.nodes(fleet) == ["b-n0000"]  # half of b: its first node
    leases: list[LeaseRecord] = []
    trace = [job(0, 0.0, 20_000.0, 8, "t"), job(1, 0.0, 20_000.0, 8, "t"), job(2, 2000.0, 600.0, 8, "t")]
    model = SiteModel(WAN, {"t": "b"}, events=(event,))
    result = simulate(trace, fleet, "stay", quiet(model), observer=leases.append)
    on_down = [r for r in leases if r.kind == "start" and "b-n0000" in r.placement.nodes]
    # Leased at 0, lost at 1,000 s, nothing placed there until 5,000 s, then used again.
    assert [r.at_s for r in on_down][:2] == [0.0, 5000.0]
    killed = [a for a in result.attempts if a.outcome == "LOST"]
    assert [(a.end_s, a.job_id) for a in killed] == [(1000.0, on_down[0].job_id)]
    assert result.totals.site_events == 1 and result.totals.interruptions == 0
    assert all(r.placement.site == "b" for r in leases)
    with pytest.raises(ValueError, match="site event at 'c': the fleet has no such site"):
        SiteEvent("c", event.start, event.end, 0.5).nodes(fleet)
    with pytest.raises(ValueError, match=r"ends .* before it starts"):
        SiteEvent("b", event.end, event.start, 0.5)


def test_stay_never_places_a_job_away_from_its_home_and_gpuyard_does_when_it_pays() -> None:
    fleet = two_sites(nodes_per_site=2)
    # Team x (home a) asks far more than a holds; team y (home b) little.
    trace = [job(i, 60.0 * i, 3_000.0, 8, "x") for i in range(12)] + [job(20, 30.0, 600.0, 4, "y")]
    home = {"x": "a", "y": "b"}
    for policy in ("stay", "gpuyard"):
        watch = Watch(fleet)
        result = simulate(trace, fleet, policy, quiet(SiteModel(WAN, home)), observer=watch)
        assert not watch.held
        leases = watch.records
        assert len(result.jobs) == len(trace)
        team = {j.id: j.team for j in trace}
        away = [r for r in leases if r.kind == "start" and r.placement.site != home[team[r.job_id]]]
        if policy == "stay":
            assert away == [] and result.totals.moves == 0
        else:
            assert away and result.totals.moves > 0
