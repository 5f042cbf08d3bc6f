"""Publication by the promotion rule, on a real MLflow registry: the alias moves only for a candidate
that beats the champion by more than the rule's margin; any other is tagged `rejected`, with why."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import yaml

from pipelines import publish
from pipelines.definition import PipelineDefinition, load_definition
from pipelines.evaluate import Scored, Verdict, decide

pytestmark = pytest.mark.slow  # MLflow stores and the publication steps


@pytest.fixture
def definition(tmp_path: Path) -> PipelineDefinition:
    raw = yaml.safe_load(load_definition("flights_delay").path.read_text())
    raw["data"]["root"] = str(tmp_path / "data")
    raw["mlflow"] = {"tracking_uri": f"sqlite:///{tmp_path / 'mlflow.db'}"}
    raw["promotion"] |= {"model": "m", "min_improvement": 0.01}
    path = tmp_path / "pipeline.yaml"
    path.write_text(yaml.safe_dump(raw))
    return load_definition(path)


def versions(definition: PipelineDefinition, count: int) -> list[str]:
    from mlflow.tracking import MlflowClient

    mlflow = MlflowClient(definition.tracking_uri)
    experiment = mlflow.create_experiment(
        "e", artifact_location=(Path(definition.data.root[7:]) / "a").as_uri()
    )
    mlflow.create_registered_model("m")
    made = []
    for _ in range(count):
        run = mlflow.create_run(experiment).info.run_id
        made.append(str(mlflow.create_model_version("m", source=f"runs:/{run}/model", run_id=run).version))
    return made


def verdict(
    definition: PipelineDefinition, candidate: tuple[str, float], champion: tuple[str, float] | None
) -> dict[str, Any]:
    scored = Scored(candidate[0], None, candidate[1])
    holder = Scored(champion[0], None, champion[1]) if champion else None
    promote, reason = decide("roc_auc", "max", scored, holder, definition.promotion.min_improvement)
    return Verdict("roc_auc", scored, holder, promote, reason).as_dict() | {"job_id": "job-1"}


def test_the_rule_promotes_only_a_clear_improvement() -> None:
    champion = Scored("1", None, 0.70)
    assert decide("roc_auc", "max", Scored("2", None, 0.72), champion, 0.01)[0]
    assert not decide("roc_auc", "max", Scored("2", None, 0.705), champion, 0.01)[0]
    assert not decide("roc_auc", "max", Scored("2", None, 0.70), champion, 0.0)[0]  # a tie does not beat
    assert decide("log_loss", "min", Scored("2", None, 0.40), Scored("1", None, 0.45), 0.01)[0]
    assert decide("roc_auc", "max", Scored("2", None, 0.5), None, 0.01) == (
        True,
        "no champion yet; the candidate's roc_auc is 0.5000",
    )
    refused, why = decide("roc_auc", "max", Scored("2", None, math.nan), None, 0.0)
    assert not refused and "nothing to compare" in why


def test_publication_refuses_a_worse_model_and_records_why(definition: PipelineDefinition) -> None:
    from mlflow.tracking import MlflowClient

    first, second = versions(definition, 2)
    mlflow = MlflowClient(definition.tracking_uri)
    done = publish.publish(
        definition, verdict(definition, (first, 0.70), None), approval=None, lineage_tags={}
    )
    assert done["promoted"] and str(mlflow.get_model_version_by_alias("m", "champion").version) == first

    worse = verdict(definition, (second, 0.704), (first, 0.70))
    done = publish.publish(definition, worse, approval=None, lineage_tags={"airflow.run_id": "r2"})
    assert not done["promoted"]
    assert str(mlflow.get_model_version_by_alias("m", "champion").version) == first  # the alias stayed
    tags = mlflow.get_model_version("m", second).tags
    assert tags["rejected"] == (
        "the candidate's roc_auc 0.7040 does not beat the champion's 0.7000 (version 1) "
        "by more than 0.01 (+0.0040)"
    )
    assert tags["airflow.run_id"] == "r2" and tags["evaluation.roc_auc"] == "0.704"


def test_a_required_approval_that_is_missing_or_refused_blocks_the_alias(
    definition: PipelineDefinition,
) -> None:
    from mlflow.tracking import MlflowClient

    gated = definition.model_copy(
        update={"promotion": definition.promotion.model_copy(update={"require_approval": True})}
    )
    [only] = versions(gated, 1)
    good = verdict(gated, (only, 0.9), None)
    refused = {"chosen_options": ["Reject"], "responded_by_user": {"id": "7", "name": "ana"}}
    assert not publish.publish(gated, good, approval=None, lineage_tags={})["promoted"]
    done = publish.publish(gated, good, approval=refused, lineage_tags={})
    assert not done["promoted"] and done["reason"].endswith("but not approved by ana")
    done = publish.publish(gated, good, approval={"chosen_options": ["Approve"]}, lineage_tags={})
    assert done["promoted"]
    assert MlflowClient(gated.tracking_uri).get_model_version_by_alias("m", "champion").version == int(only)
