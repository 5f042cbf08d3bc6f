"""GpuTrainingOperator's arguments: templated job settings read back with their types, a bad one
refused by name, and `deferrable` taken from Airflow's `[operators] default_deferrable`."""

from __future__ import annotations

from typing import Any

import pytest
from gpuyard_provider.operators.training import GpuTrainingOperator, choice


@pytest.mark.parametrize(
    ("argument", "rendered", "value"),
    [
        ("gpus", "4", 4),
        ("gpus", 2, 2),
        ("gpus", "None", 1),  # a None Param, rendered: the default
        ("max_steps", "", None),
        ("max_steps", "250", 250),
        ("preemptible", "False", False),
        ("preemptible", "true", True),
        ("preemptible", True, True),
        ("new_job", None, False),
        ("gpu_type", "None", None),
        ("gpu_type", "a100", "a100"),
        ("priority", "high", "high"),
    ],
)
def test_a_rendered_argument_keeps_its_type(argument: str, rendered: Any, value: Any) -> None:
    assert choice(argument, rendered) == value and type(choice(argument, rendered)) is type(value)


@pytest.mark.parametrize(
    ("argument", "rendered"),
    [
        ("gpus", "two"),
        ("gpus", True),
        ("gpus", "-1"),
        ("max_steps", 2.5),
        ("preemptible", "maybe"),
        ("priority", 3),
    ],
)
def test_a_bad_argument_is_refused_by_name(argument: str, rendered: Any) -> None:
    with pytest.raises(ValueError, match=rf"GpuTrainingOperator argument {argument}: expected"):
        choice(argument, rendered)


def operator(**arguments: Any) -> GpuTrainingOperator:
    return GpuTrainingOperator(
        task_id="train",
        name="t",
        team="a",
        training_config="c.yaml",
        checkpoint_root="file:///c",
        **arguments,
    )


@pytest.mark.parametrize(("configured", "deferrable"), [(None, False), ("True", True), ("False", False)])
def test_deferrable_defaults_from_airflow_s_configuration(
    monkeypatch: pytest.MonkeyPatch, configured: str | None, deferrable: bool
) -> None:
    if configured is None:
        monkeypatch.delenv("AIRFLOW__OPERATORS__DEFAULT_DEFERRABLE", raising=False)
    else:
        monkeypatch.setenv("AIRFLOW__OPERATORS__DEFAULT_DEFERRABLE", configured)
    assert operator().deferrable is deferrable
    assert operator(deferrable=not deferrable).deferrable is (not deferrable)  # an argument wins


def test_every_job_argument_is_templated() -> None:
    assert {"gpus", "gpu_type", "priority", "preemptible", "max_steps", "new_job", "image", "nodes"} <= set(
        GpuTrainingOperator.template_fields
    )
