"""Promotion between environments: the definition's environments and their errors, the rules (who
refuses, the history's lines), and the moves on real MLflow registries (sqlite), one of them another
registry the version is copied into."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import pytest
import yaml

from pipelines import promotion, publish
from pipelines.definition import PipelineDefinition, load_definition
from pipelines.errors import ConfigError

AT = dt.datetime(2026, 12, 7, 9, 30, tzinfo=dt.UTC)
APPROVED = {"chosen_options": ["Approve"], "responded_by_user": {"id": "7", "name": "ana"}}


def write(tmp_path: Path, name: str = "pipeline.yaml", **promotion_section: Any) -> Path:
    raw = yaml.safe_load(load_definition("flights_delay").path.read_text())
    raw["data"]["root"] = str(tmp_path / "data")
    raw["mlflow"] = {"tracking_uri": f"sqlite:///{tmp_path / 'mlflow.db'}"}
    raw["promotion"] = {"model": "m", **promotion_section}
    path = tmp_path / name
    path.write_text(yaml.safe_dump(raw))
    return path


def test_without_environments_the_alias_is_the_one_environment(tmp_path: Path) -> None:
    plain = load_definition(write(tmp_path, require_approval=True)).promotion
    assert plain.alias == "champion" and plain.names == ["champion"]
    assert plain.environments[0].requires_approval is True and plain.environments[0].registry is None


def test_environments_resolve_the_alias_and_the_approvals(tmp_path: Path) -> None:
    other = f"sqlite:///{tmp_path / 'production.db'}"
    path = write(
        tmp_path,
        environments=[
            {"name": "staging", "alias": "staging", "requires_approval": True},
            {"name": "qa", "alias": "qa", "requires_approval": False},
            {"name": "production", "alias": "production", "registry": other},
        ],
    )
    resolved = load_definition(path).promotion
    assert resolved.alias == "staging" and resolved.require_approval is True  # publication's
    assert [(e.name, e.requires_approval, e.registry) for e in resolved.environments] == [
        ("staging", True, None),
        ("qa", False, None),
        ("production", True, other),  # a later environment is approved unless it says otherwise
    ]


@pytest.mark.parametrize(
    ("section", "message"),
    [
        (
            {"environments": [{"name": "staging", "alias": "a"}, {"name": "staging", "alias": "b"}]},
            "promotion.environments: environments[1].name 'staging' repeats environments[0].name",
        ),
        (
            {"environments": [{"name": "staging", "alias": "a"}, {"name": "production", "alias": "a"}]},
            "promotion.environments: environments[1].alias 'a' repeats environments[0].alias",
        ),
        (
            {
                "require_approval": False,
                "environments": [{"name": "s", "alias": "s", "requires_approval": True}],
            },
            "promotion: environments[0].requires_approval (True) contradicts require_approval (False)",
        ),
        (
            {"alias": "champion", "environments": [{"name": "staging", "alias": "staging"}]},
            "promotion: alias 'champion' contradicts environments[0].alias 'staging'",
        ),
        (
            {"environments": [{"name": "staging", "alias": "s", "registry": "sqlite:///elsewhere.db"}]},
            "promotion: environments[0].registry: publication moves the first environment's alias",
        ),
        (
            {"environments": [{"name": "staging", "alias": "s", "approver": "ana"}]},
            "promotion.environments.0.approver: Extra inputs are not permitted",
        ),
        (
            {"environments": [{"name": "Prod-1", "alias": "p"}]},
            "promotion.environments.0.name: String should",
        ),
        ({"alias": "latest"}, "promotion.alias: 'latest' is an alias MLflow reserves"),
    ],
)
def test_a_bad_environment_is_refused_naming_its_field(
    tmp_path: Path, section: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigError) as refused:
        load_definition(write(tmp_path, **section))
    assert message in str(refused.value)


def test_an_approval_refuses_unless_approved_and_says_by_whom() -> None:
    assert promotion.refusal(None, required=False) is None
    assert promotion.refusal(APPROVED, required=True) is None
    assert promotion.refusal(None, required=True) == "an approval is required and none was given"
    rejected = {"chosen_options": ["Reject"], "responded_by_user": {"id": "7", "name": "ana"}}
    assert promotion.refusal(rejected, required=True) == "not approved by ana"
    timed_out = {"chosen_options": ["Reject"], "responded_by_user": None}  # the HITL default on timeout
    assert promotion.refusal(timed_out, required=True) == (
        "not approved: no answer before the approval timed out"
    )
    assert promotion.approver(APPROVED) == "ana" and promotion.approver(timed_out) is None


def test_history_lines_are_numbered_after_the_last_one() -> None:
    assert promotion.history_key({}) == "history.1"
    assert promotion.history_key({"history.1": "{}", "history.10": "{}", "history": "x", "rejected": ""}) == (
        "history.11"
    )
    line = promotion.history_line(
        environment="production",
        alias="production",
        version="3",
        at=AT.astimezone(dt.timezone(dt.timedelta(hours=2))),
        by="ana",
        from_registry="sqlite:///a.db",
        to_registry="sqlite:///b.db",
        to_version="1",
    )
    assert line == {
        "environment": "production",
        "alias": "production",
        "version": "3",
        "at": "2026-12-07T09:30:00+00:00",  # UTC, whatever the clock's zone
        "by": "ana",
        "from_registry": "sqlite:///a.db",
        "to_registry": "sqlite:///b.db",
        "to_version": "1",
    }
    tags = {"history.2": '{"environment": "production"}', "history.10": '{"environment": "x"}'}
    assert [h["environment"] for h in promotion.history(tags | {"history.1": '{"environment": "s"}'})] == [
        "s",
        "production",
        "x",
    ]


@pytest.mark.slow  # two MLflow registries (sqlite)
def test_a_published_version_moves_through_the_environments_into_another_registry(tmp_path: Path) -> None:
    from mlflow.tracking import MlflowClient

    production = f"sqlite:///{tmp_path / 'production.db'}"
    definition: PipelineDefinition = load_definition(
        write(
            tmp_path,
            environments=[
                {"name": "staging", "alias": "staging"},
                {"name": "qa", "alias": "qa", "requires_approval": False},
                {"name": "production", "alias": "production", "registry": production},
            ],
        )
    )
    own = MlflowClient(definition.tracking_uri)
    experiment = own.create_experiment("e", artifact_location=(tmp_path / "artifacts").as_uri())
    own.create_registered_model("m")
    run = own.create_run(experiment).info.run_id
    version = str(own.create_model_version("m", source=f"runs:/{run}/model", run_id=run).version)
    verdict = {
        "metric": "roc_auc",
        "candidate": {"version": version, "run_id": run, "value": 0.74},
        "champion": None,
        "promote": True,
        "reason": "no champion yet; the candidate's roc_auc is 0.7400",
        "summary": "| roc_auc | 0.7400 |",
    }

    staged = publish.publish(definition, verdict, approval=None, lineage_tags={"airflow.run_id": "r1"})
    assert staged["promoted"] and staged["environment"] == "staging"
    assert str(own.get_model_version_by_alias("m", "staging").version) == version
    assert "published by the promotion rule in DAG run r1" in staged["summary"]

    qa = promotion.promote(definition, "qa", staged, None, now=AT)  # no approval asked: it moves on
    assert qa["promoted"] and str(own.get_model_version_by_alias("m", "qa").version) == version

    refused = {"chosen_options": ["Reject"], "responded_by_user": {"id": "8", "name": "bo"}}
    kept_out = promotion.promote(definition, "production", qa, refused, now=AT)
    assert not kept_out["promoted"] and kept_out["reason"].endswith("not approved by bo")
    target = MlflowClient(tracking_uri=definition.tracking_uri, registry_uri=production)
    assert target.search_registered_models() == []  # nothing copied, nothing moved
    assert own.get_model_version("m", version).tags["rejected.production"] == kept_out["reason"]

    promoted = promotion.promote(definition, "production", qa, APPROVED, now=AT)
    copy = target.get_model_version_by_alias("m", "production")
    assert promoted["promoted"] and promoted["to_version"] == str(copy.version) == "1"
    assert copy.tags[promotion.COPIED_FROM] == f"{definition.tracking_uri}#models:/m/{version}"
    # registered from the source's files, a location the other registry reaches without the source's runs
    assert copy.source == f"{(tmp_path / 'artifacts').as_uri()}/{run}/artifacts/model"
    assert "production (`production`): version 1" in promoted["summary"]
    assert "| roc_auc | 0.7400 |" in promoted["summary"]  # the metrics the approver saw stay with it

    history = promotion.history(own.get_model_version("m", version).tags)
    assert [(h["environment"], h["by"], h["to_registry"], h["to_version"]) for h in history] == [
        ("staging", "the promotion rule", definition.tracking_uri, version),
        ("qa", "the promotion rule", definition.tracking_uri, version),
        ("production", "ana", production, "1"),
    ]
    assert promotion.history(copy.tags) == [history[-1]]  # the copy's history starts with its copy

    again = promotion.promote(definition, "production", qa, APPROVED, now=AT)  # a retried task
    assert again["to_version"] == "1" and len(target.search_model_versions("name = 'm'")) == 1
    assert promotion.history(own.get_model_version("m", version).tags) == history  # its line written once
    assert promotion.history(target.get_model_version("m", "1").tags) == [history[-1]]
