"""How often nodes and gangs are interrupted (domain/interruptions.py): the automatic checkpoint
interval's rate."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

import pytest
from gpuyard.domain.interruptions import (
    HALF_LIFE_S,
    NodeRecord,
    ended_attempt,
    gang_mtbi_s,
    node_rate,
)
from gpuyard.domain.retry import young_daly_interval_s

NOW = datetime(2026, 12, 4, tzinfo=UTC)
SPOT = 24 * 3600.0


def test_a_gang_of_eight_spot_nodes_checkpoints_as_often_as_eight_times_the_failures_ask() -> None:
    one = gang_mtbi_s([node_rate(None, SPOT, NOW)])
    eight = gang_mtbi_s([node_rate(None, SPOT, NOW)] * 8)
    assert one == pytest.approx(SPOT) and eight == pytest.approx(SPOT / 8)
    ratio = young_daly_interval_s(30.0, one) / young_daly_interval_s(30.0, eight)
    assert ratio == pytest.approx(8**0.5)


def test_a_lost_gang_charges_each_of_its_nodes_its_share_and_its_run_time() -> None:
    known = {"n0": NodeRecord(100.0, 1.0, NOW)}
    after = ended_attempt(known, ["n0", "n1", "n2", "n3", "n1"], 3600.0, True, NOW)
    assert after == {
        "n0": NodeRecord(3700.0, 1.25, NOW),
        **{n: NodeRecord(3600.0, 0.25, NOW) for n in ("n1", "n2", "n3")},
    }
    kept = ended_attempt(known, ["n0"], 60.0, False, NOW)  # an ending that is not a loss: run time only
    assert kept == {"n0": NodeRecord(160.0, 1.0, NOW)}


def test_a_record_weighs_half_a_half_life_later_and_a_clock_gone_back_decays_nothing() -> None:
    record = NodeRecord(7200.0, 2.0, NOW)
    later = record.at_time(NOW + timedelta(seconds=HALF_LIFE_S))
    assert (later.run_s, later.interruptions) == (pytest.approx(3600.0), pytest.approx(1.0))
    assert record.at_time(NOW - timedelta(hours=1)) == record


def test_a_pool_of_equal_nodes_is_charged_its_true_rate_whatever_the_gang_sizes() -> None:
    """Nodes that fail at rate 1/MTBI each, gangs of 1 to 8 of them: the records' rate comes back to
    1/MTBI (the prior's pull fading as history grows), though no loss names its node."""
    rng, mtbi = random.Random(7), 6 * 3600.0
    records: dict[str, NodeRecord] = {}
    nodes = [f"n{i}" for i in range(8)]
    t = NOW
    for _ in range(4000):
        gang = rng.sample(nodes, rng.randint(1, 8))
        ran = min(rng.expovariate(len(gang) / mtbi), 3 * 3600.0)  # the first of its nodes to fail
        lost = ran < 3 * 3600.0
        t += timedelta(seconds=1)  # far less than the half-life: the test sees no decay
        records |= ended_attempt(records, gang, ran, lost, t)
    rates = [node_rate(records[n], SPOT, t) for n in nodes]
    assert sum(rates) / len(rates) == pytest.approx(1 / mtbi, rel=0.05)


def test_a_prior_must_be_positive() -> None:
    with pytest.raises(ValueError, match="prior MTBI must be positive"):
        node_rate(None, 0.0, NOW)
    with pytest.raises(ValueError, match="at least one node"):
        gang_mtbi_s([])
