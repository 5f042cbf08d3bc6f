"""Publication: move the registry alias to the candidate, or tag it `rejected` with the reason.

The alias (`champion` by default) moves only when every check passed, the candidate beat the
champion by the definition's rule (evaluate.decide) and, when the definition asks for it, a person
approved it in the Airflow UI. Otherwise the version keeps a `rejected` tag that says why; the
registry is the record either way.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import Any

from pipelines import lineage
from pipelines.definition import PipelineDefinition

APPROVE = "Approve"


def approval_refusal(definition: PipelineDefinition, approval: Mapping[str, Any] | None) -> str | None:
    """Why the approval gate says no, or None when it says yes (or the definition has no gate)."""
    if not definition.promotion.require_approval:
        return None
    if approval is None:
        return "the definition requires an approval and none was given"
    if APPROVE not in (approval.get("chosen_options") or []):
        who = approval.get("responded_by_user") or {}
        return f"not approved by {who.get('name') or who.get('id') or 'the approver'}"
    return None


def publish(
    definition: PipelineDefinition,
    verdict: Mapping[str, Any],
    *,
    approval: Mapping[str, Any] | None,
    lineage_tags: Mapping[str, str],
) -> dict[str, Any]:
    """Apply the verdict to the registry; returns what was done and why."""
    name, alias = definition.promotion.model, definition.promotion.alias
    version = verdict["candidate"]["version"]
    refused = approval_refusal(definition, approval)
    promote = bool(verdict["promote"]) and refused is None
    reason = verdict["reason"] if refused is None else f"{verdict['reason']}; but {refused}"
    now = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
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
    return {"promoted": promote, "model": name, "version": version, "alias": alias, "reason": reason}
