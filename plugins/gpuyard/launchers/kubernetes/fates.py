"""Pure mapping from what Kubernetes says about pods to attempt outcomes.

A pod's fate comes from its worker container's state and the pod's phase, reason and conditions.
An attempt's fate comes from ALL its pods: the gang runs when every pod runs, succeeds when every
pod succeeded, and ends as soon as one pod ends otherwise. When several pods ended badly, the cause
that is not the job's fault wins (LOST over PREEMPTED over FAILED): a lost node makes its peers'
collectives fail too, and those failures must not use up the job's failure budget.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from gpuyard.launchers.base import EXIT_PREEMPTED, EXIT_STALE_TOKEN, Outcome, outcome_of_exit

# Pod status reasons meaning the pod was pushed off its node, not that the job broke.
LOST_POD_REASONS = frozenset(
    {
        "Evicted",
        "Preempting",
        "NodeLost",
        "Shutdown",
        "NodeShutdown",
        "Terminated",
        "UnexpectedAdmissionError",
        "NodeAffinity",
        "OutOfcpu",
        "OutOfmemory",
        "OutOfnvidia.com/gpu",
    }
)
# DisruptionTarget condition reasons (Kubernetes >= 1.26) with the same meaning.
DISRUPTION_REASONS = frozenset(
    {
        "PreemptionByScheduler",
        "PreemptionByKubeScheduler",
        "DeletionByTaintManager",
        "EvictionByEvictionAPI",
        "DeletionByPodGC",
        "TerminationByKubelet",
    }
)
# Of those, the ones a Ready node's kubelet carries out: SIGTERM, the grace period, then SIGKILL. Until its
# worker's container ended, the pod runs (saving a checkpoint on the notice): its exit is its fate, and a
# successor launched before it would run beside it (fault campaign seed 1011: an eviction).
GRACEFUL_DISRUPTIONS = frozenset(
    {"PreemptionByScheduler", "PreemptionByKubeScheduler", "EvictionByEvictionAPI", "TerminationByKubelet"}
)
KILLED_BY_DELETION = frozenset({128 + 15, 128 + 9})  # a container's exit code after SIGTERM, SIGKILL
IMAGE_PULL_REASONS = frozenset({"ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull"})
CREATE_ERROR_REASONS = frozenset({"CreateContainerConfigError", "CreateContainerError", "RunContainerError"})
# Waiting reasons of a container on its way up on its node (pulling its image, init containers).
STARTING_REASONS = frozenset({"ContainerCreating", "PodInitializing"})

_SEVERITY = {Outcome.LOST: 3, Outcome.PREEMPTED: 2, Outcome.FAILED: 1}


@dataclass(frozen=True)
class PodFate:
    """One pod's state as far as gpuyard cares. `outcome` None: not started yet (pending)."""

    outcome: Outcome | None
    reason: str | None = None
    exit_code: int | None = None
    disrupted: bool = False  # the cluster stopped or lost it (eviction, preemption, node gone)

    @property
    def ended(self) -> bool:
        return self.outcome is not None and self.outcome is not Outcome.RUNNING


PENDING = PodFate(None)


def _detail(reason: str, message: str | None) -> str:
    return f"{reason}: {message}" if message else reason


def _worker_status(status: Mapping[str, Any], container: str) -> Mapping[str, Any]:
    for item in status.get("containerStatuses") or ():
        if item.get("name") == container:
            return item
    return {}


def _disruption_target(status: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The pod's DisruptionTarget condition, where it says the cluster is taking the pod away."""
    known = {*DISRUPTION_REASONS, "DisruptionTarget"}
    for condition in status.get("conditions") or ():
        says = condition.get("type") == "DisruptionTarget" and condition.get("status") == "True"
        if says and (condition.get("reason") or "DisruptionTarget") in known:
            return condition
    return None


def pod_fate(pod: Mapping[str, Any], container: str = "worker") -> PodFate:
    """What became of one pod, from its status alone."""
    status = pod.get("status") or {}
    phase = status.get("phase")
    pod_reason = status.get("reason")
    lost_reason = _detail(pod_reason, status.get("message")) if pod_reason in LOST_POD_REASONS else None
    target = _disruption_target(status)
    if lost_reason is None and target is not None:
        lost_reason = _detail(target.get("reason") or "DisruptionTarget", target.get("message"))
    state = _worker_status(status, container).get("state") or {}

    terminated = state.get("terminated")
    if terminated is not None:
        code = int(terminated.get("exitCode", 1))
        if code in (0, EXIT_PREEMPTED, EXIT_STALE_TOKEN):
            outcome, reason = outcome_of_exit(code)
            return PodFate(
                outcome, f"{reason} ({lost_reason})" if lost_reason else reason, code, bool(lost_reason)
            )
        if lost_reason:
            return PodFate(Outcome.LOST, f"{lost_reason} (worker exited {code})", code, True)
        if terminated.get("reason") == "OOMKilled":
            return PodFate(Outcome.FAILED, "OOMKilled", code)
        if code in KILLED_BY_DELETION and (pod.get("metadata") or {}).get("deletionTimestamp"):
            # its pod deleted (the grace period's SIGTERM, then SIGKILL): the deletion's doing, not the job's
            # (seed 1013: a worker ending 0 as its pod was deleted died of the SIGTERM, 143)
            return PodFate(Outcome.LOST, f"pod deleted (worker exited {code})", code, True)
        _, reason = outcome_of_exit(code)
        extra = terminated.get("message") or terminated.get("reason")
        return PodFate(Outcome.FAILED, f"{reason} ({extra})" if extra else reason, code)

    if lost_reason:
        graceful = pod_reason not in LOST_POD_REASONS and (target or {}).get("reason") in GRACEFUL_DISRUPTIONS
        if graceful and state.get("running") is not None:
            return PodFate(Outcome.RUNNING)  # being stopped: it ends within its grace period
        return PodFate(Outcome.LOST, lost_reason, disrupted=True)

    waiting = state.get("waiting") or {}
    waiting_reason = waiting.get("reason")
    if waiting_reason in IMAGE_PULL_REASONS:
        return PodFate(
            Outcome.FAILED, f"image pull failed: {_detail(waiting_reason, waiting.get('message'))}"
        )
    if waiting_reason in CREATE_ERROR_REASONS:
        return PodFate(
            Outcome.FAILED, f"container not created: {_detail(waiting_reason, waiting.get('message'))}"
        )

    if phase == "Succeeded":
        return PodFate(Outcome.SUCCEEDED, "exited 0", 0)
    if phase == "Failed":
        return PodFate(Outcome.FAILED, _detail(pod_reason or "pod failed", status.get("message")))
    if phase == "Unknown":
        return PodFate(Outcome.LOST, "pod phase Unknown: its node stopped reporting", disrupted=True)
    if phase == "Running":
        return PodFate(Outcome.RUNNING)
    return PENDING


def starting(pod: Mapping[str, Any], container: str = "worker") -> str | None:
    """How a pod bound to its node is coming up (its worker's waiting reason, or "Pending" before the
    kubelet's first status); None when it is not starting: running, ended, in error, or unbound."""
    if not (pod.get("spec") or {}).get("nodeName"):
        return None  # not placed on a node yet (unschedulable, or no scheduler): nothing is under way
    status = pod.get("status") or {}
    state = _worker_status(status, container).get("state")
    if state is None:
        return "Pending" if status.get("phase", "Pending") == "Pending" else None
    reason = (state.get("waiting") or {}).get("reason")
    return reason if reason in STARTING_REASONS else None


def attempt_fate(fates: Mapping[int, PodFate], gang_size: int) -> PodFate:
    """The attempt's fate from its pods' fates by node rank (absent ranks are not running yet)."""
    ended_badly = [
        (rank, fate) for rank, fate in sorted(fates.items()) if fate.ended and fate.outcome in _SEVERITY
    ]
    if ended_badly:
        rank, worst = max(ended_badly, key=lambda item: _SEVERITY[item[1].outcome])  # type: ignore[index]
        prefix = f"node rank {rank}" if gang_size > 1 else "worker"
        disrupted = any(fate.disrupted for _, fate in ended_badly)
        return PodFate(worst.outcome, f"{prefix}: {worst.reason}", worst.exit_code, disrupted)
    present = [fates[rank] for rank in range(gang_size) if rank in fates]
    if len(present) == gang_size and all(f.outcome is Outcome.SUCCEEDED for f in present):
        return PodFate(Outcome.SUCCEEDED, "every worker exited 0", 0)
    if len(present) == gang_size and all(f.outcome in (Outcome.RUNNING, Outcome.SUCCEEDED) for f in present):
        return PodFate(Outcome.RUNNING)
    return PENDING


def gone_fate(last: PodFate | None, *, cancelled: bool, why: str) -> PodFate:
    """The fate of a pod that vanished from the API: what it last reported, else LOST."""
    if last is not None and last.ended:
        return replace(last, disrupted=last.disrupted or cancelled)
    if cancelled:
        return PodFate(
            Outcome.LOST, "cancelled: pod deleted before its worker reported an exit", disrupted=True
        )
    return PodFate(Outcome.LOST, why, disrupted=True)
