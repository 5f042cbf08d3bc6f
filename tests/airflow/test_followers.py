"""The followers' pace comes from Airflow's configuration, and a bad one is refused by name."""

from __future__ import annotations

import pytest
from gpuyard_provider.triggers.followers import PACE_S, follow_pace_s


def test_the_pace_is_an_airflow_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AIRFLOW__GPUYARD__FOLLOW_PACE_S", raising=False)
    assert follow_pace_s() == PACE_S
    monkeypatch.setenv("AIRFLOW__GPUYARD__FOLLOW_PACE_S", "1.5")
    assert follow_pace_s() == 1.5


@pytest.mark.parametrize("value", ["-1", "nan", "600"])
def test_a_pace_out_of_range_is_refused_by_name(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv("AIRFLOW__GPUYARD__FOLLOW_PACE_S", value)
    with pytest.raises(ValueError, match=r"\[gpuyard\] follow_pace_s: expected seconds from 0 to 60"):
        follow_pace_s()
