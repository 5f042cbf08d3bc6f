"""Publication: move the first environment's alias to the candidate, or tag it `rejected` with why.

The alias (`champion` by default, else that of the definition's first environment) moves only when
every check passed, the candidate beat the champion by the definition's rule (evaluate.decide) and,
when the definition asks for it, a person approved it in the Airflow UI. Otherwise the version keeps
a `rejected` tag that says why; the registry is the record either way, and a move is also a line of
the version's history (pipelines/promotion.py, which moves it on to the later environments).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import Any

from pipelines import lineage, promotion
from pipelines.definition import PipelineDefinition


def approval_refusal(definition: PipelineDefinition, approval: Mapping[str, Any] | None) -> str | None:
    """Why the approval gate says no, or None when it says yes (or the definition has no gate)."""
    return promotion.refusal(approval, definition.promotion.require_approval)


def publish(
    definition: PipelineDefinition,
    verdict: Mapping[str, Any],
    *,
    approval: Mapping[str, Any] | None,
    lineage_tags: Mapping[str, str],
) -> dict[str, Any]:
    """Apply the verdict to the registry; returns what was done and why."""
    name, alias = definition.promotion.model, definition.promotion.alias
    environment = definition.promotion.environments[0].name
    version = verdict["candidate"]["version"]
    refused = approval_refusal(definition, approval)
    promote = bool(verdict["promote"]) and refused is None
    reason = verdict["reason"] if refused is None else f"{verdict['reason']}; but {refused}"
    at = dt.datetime.now(dt.UTC)
    now = at.isoformat(timespec="seconds")
    tags: dict[str, Any] = {**lineage_tags, f"evaluation.{verdict['metric']}": verdict["candidate"]["value"]}
    if promote:
        lineage.client(definition).set_registered_model_alias(name, alias, version)
        tags |= {"promoted_at": now, "promotion_reason": reason}
        if verdict.get("champion"):
            tags["replaced_version"] = verdict["champion"]["version"]
    else:
        tags |= {"rejected": reason, "rejected_at": now}
    if approval is not None:
        tags["approval"] = approval
    lineage.tag_version(definition, version, tags)
    by = promotion.approver(approval) or promotion.RULE
    outcome = {"promoted": promote, "model": name, "version": version, "alias": alias, "reason": reason}
    outcome |= {"environment": environment, "registry": definition.tracking_uri, "by": by}
    outcome["metrics"] = {verdict["metric"]: verdict["candidate"]["value"]}
    if promote:
        line = promotion.history_line(
            environment=environment,
            alias=alias,
            version=version,
            at=at,
            by=by,
            from_registry=definition.tracking_uri,
            to_registry=definition.tracking_uri,
        )
        promotion.record(lineage.client(definition), name, version, line)
        run = f" in DAG run {lineage_tags['airflow.run_id']}" if lineage_tags.get("airflow.run_id") else ""
        outcome["summary"] = (
            f"{verdict.get('summary') or reason}\n\n{environment} (`{alias}`): version {version}, "
            f"published by {by}{run}, {line['at']}"
        )
    return outcome
