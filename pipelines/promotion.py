"""Promotion between environments: a published version moves on, one approved step at a time.

A definition's `promotion.environments` are in order (`staging`, `production`, ...). Publication
moves the first one's alias by the evaluation rule (pipelines/publish.py). Each later environment
is a step of its own after it: a person approves (the HITL operator, pipelines/tasks.py), then its
alias moves to the version the step before it moved. An environment that names another MLflow
registry gets a copy of the version there, registered from the source's artifacts, and its alias
moves on the copy. Versions are always taken from the pipeline's own registry, where candidates are
registered; a retried step finds its copy again by the `copied_from` tag instead of making another.

Each move is a line in the version's history: a model version tag `history.<n>` holding one JSON
object (environment, alias, version, at, by, from_registry, to_registry, to_version), on the
pipeline's version and on its copy. The rules (who refuses, which key comes next, what a line says)
are pure functions; MLflow is reached only at the edges below them.
"""

from __future__ import annotations

import datetime as dt
import json
import re
from collections.abc import Mapping
from typing import Any

from pipelines import lineage
from pipelines.definition import PipelineDefinition
from training.mlflow_create import already_exists

APPROVE = "Approve"
HISTORY = "history."
COPIED_FROM = "copied_from"  # on a copy: <source registry>#models:/<model>/<version>
RULE = "the promotion rule"


def approver(approval: Mapping[str, Any] | None) -> str | None:
    """Who answered an approval (the HITL operator's result), by name, else id."""
    who = (approval or {}).get("responded_by_user") or {}
    return who.get("name") or who.get("id") or None


def refusal(approval: Mapping[str, Any] | None, required: bool) -> str | None:
    """Why an approval gate says no, or None when it says yes (or there is no gate)."""
    if not required:
        return None
    if approval is None:
        return "an approval is required and none was given"
    if APPROVE not in (approval.get("chosen_options") or []):
        who = approver(approval)
        return f"not approved by {who}" if who else "not approved: no answer before the approval timed out"
    return None


def _numbered(tags: Mapping[str, str]) -> list[tuple[int, str]]:
    """The history tags of a version, (n, `history.<n>`), in order."""
    return sorted((int(m.group(1)), key) for key in tags if (m := re.fullmatch(r"history\.([0-9]+)", key)))


def history_key(tags: Mapping[str, str]) -> str:
    """The tag of the next line of a version's history: `history.<n>`, after the last one."""
    numbered = _numbered(tags)
    return f"{HISTORY}{numbered[-1][0] + 1 if numbered else 1}"


def history(tags: Mapping[str, str]) -> list[dict[str, Any]]:
    """A version's history, oldest first, from its tags."""
    return [json.loads(tags[key]) for _, key in _numbered(tags)]


def history_line(
    *,
    environment: str,
    alias: str,
    version: str,
    at: dt.datetime,
    by: str,
    from_registry: str,
    to_registry: str,
    to_version: str | None = None,
) -> dict[str, Any]:
    """One move: `version` (of the pipeline's registry) took `alias` of `environment`, as
    `to_version` of `to_registry` (the same version when it is the pipeline's registry)."""
    return {
        "environment": environment,
        "alias": alias,
        "version": str(version),
        "at": at.astimezone(dt.UTC).isoformat(timespec="seconds"),
        "by": by,
        "from_registry": from_registry,
        "to_registry": to_registry,
        "to_version": str(to_version or version),
    }


def copy_source(registry: str, model: str, version: str) -> str:
    return f"{registry}#models:/{model}/{version}"


# The MLflow edges


def same_move(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    """The same move, whenever it was written (a retried step writes its line again)."""
    return {k: v for k, v in a.items() if k != "at"} == {k: v for k, v in b.items() if k != "at"}


def record(mlflow: Any, model: str, version: str, line: Mapping[str, Any]) -> str:
    """Append a line to a version's history, unless its last line is this same move (a retry);
    returns the line's tag."""
    tags = mlflow.get_model_version(model, version).tags
    numbered = _numbered(tags)
    if numbered and same_move(json.loads(tags[numbered[-1][1]]), line):
        return numbered[-1][1]
    key = history_key(tags)
    mlflow.set_model_version_tag(model, version, key, json.dumps(dict(line), sort_keys=True))
    return key


def artifact_location(source: Any, tracking_uri: str, model: str, version: str) -> str:
    """Where a version's files are, as a URI another registry resolves without the source's:
    `runs:/` and `models:/` (a logged model) become their run's or logged model's location, and a
    tracking server's `mlflow-artifacts:` its HTTP address."""
    found = source.get_model_version(model, version)
    location = found.source
    if location.startswith("runs:/"):
        run_id, _, path = location[len("runs:/") :].partition("/")
        location = source.get_run(run_id).info.artifact_uri.rstrip("/") + (f"/{path}" if path else "")
    elif location.startswith("models:/") and getattr(found, "model_id", None):
        location = source.get_logged_model(found.model_id).artifact_location
    if location.startswith("mlflow-artifacts:"):
        from mlflow.store.artifact.mlflow_artifacts_repo import MlflowArtifactsRepository

        location = MlflowArtifactsRepository.resolve_uri(location, tracking_uri)
    return location


def copy_version(definition: PipelineDefinition, target: Any, registry: str, version: str) -> str:
    """The copy of the pipeline's `version` in the registry `target` reaches: the one a try before
    made (its `copied_from` tag), else a new version registered from the source's artifacts."""
    from mlflow.exceptions import MlflowException

    model = definition.promotion.model
    origin = copy_source(definition.tracking_uri, model, version)
    try:  # create, not look up first: two promotions at once would both find none and both create
        target.create_registered_model(model, description=f"copied from {definition.tracking_uri}")
    except MlflowException as error:  # made by a try before, or by another promotion just now
        if not already_exists(error):
            raise
    for found in target.search_model_versions(f"name = '{model}'"):
        if found.tags.get(COPIED_FROM) == origin:
            return str(found.version)
    source = lineage.client(definition)
    original = source.get_model_version(model, version)
    location = artifact_location(source, definition.tracking_uri, model, version)
    tags = {k: v for k, v in original.tags.items() if not k.startswith(HISTORY)} | {COPIED_FROM: origin}
    made = target.create_model_version(model, location, tags=tags, description=original.description)
    return str(made.version)


def promote(
    definition: PipelineDefinition,
    name: str,
    moved: Mapping[str, Any],
    approval: Mapping[str, Any] | None,
    *,
    now: dt.datetime | None = None,
) -> dict[str, Any]:
    """Move environment `name`'s alias to the version the step before it moved (`moved`: its
    outcome), once approved; copied into the environment's registry when it names another. A
    refusal moves nothing and is tagged on the version (`rejected.<environment>`)."""
    environment = definition.promotion.environment(name)
    model, version = definition.promotion.model, str(moved["version"])
    own = definition.tracking_uri
    registry = environment.registry or own
    at = now or dt.datetime.now(dt.UTC)
    outcome = {"model": model, "version": version, "environment": name, "alias": environment.alias}
    outcome |= {"registry": registry, "metrics": moved.get("metrics", {})}
    refused = refusal(approval, bool(environment.requires_approval))
    source = lineage.client(definition)
    if refused is not None:
        reason = f"{model} version {version} stays out of {name}: {refused}"
        source.set_model_version_tag(model, version, f"rejected.{name}", reason)
        return outcome | {"promoted": False, "reason": reason}
    by = approver(approval) or RULE
    target, to_version = source, version
    if registry != own:
        target = lineage.client(definition, registry)
        to_version = copy_version(definition, target, registry, version)
    target.set_registered_model_alias(model, environment.alias, to_version)
    line = history_line(
        environment=name,
        alias=environment.alias,
        version=version,
        at=at,
        by=by,
        from_registry=own,
        to_registry=registry,
        to_version=to_version,
    )
    record(source, model, version, line)
    if target is not source:
        record(target, model, to_version, line)
    reason = f"approved by {by}" if approval is not None else f"moved on from {moved.get('environment')}"
    summary = (
        f"{moved.get('summary', '')}\n\n{name} (`{environment.alias}`): version {to_version} of {registry}, "
        f"{reason}, {line['at']}"
    ).strip()
    outcome |= {"to_version": to_version, "by": by, "reason": reason, "summary": summary}
    return outcome | {"promoted": True}
