"""How the suite's units of work reach pytest-xdist's workers (tests/conftest.py wires it in).

A unit of work (a group, or a test of none) marked `starts_first` runs for minutes: queued behind
another such unit on one worker, the two would make the suite's tail. Their group names carry FIRST,
and the controller's scheduler (StartsFirst) hands them out before everything else, one to a worker
while there are workers. The controller sees test ids only, not markers: hence the name.
"""

from __future__ import annotations

from xdist.scheduler import LoadGroupScheduling
from xdist.workermanage import WorkerController

FIRST = "first:"


def first_group(name: str) -> str:
    """The group name of a `starts_first` unit. No "]" in it: xdist reads a node id whose last "]"
    follows its "@" as a parametrized test's own id, so a parametrized test's group was lost (the
    fault campaigns ran last, at the suite's tail: tests/cpu_profile.py)."""
    return FIRST + name.replace("[", "(").replace("]", ")")


class StartsFirst(LoadGroupScheduling):
    """`--dist loadgroup`, with the units marked `starts_first` at the head of the queue."""

    _ordered = False

    def _assign_work_unit(self, node: WorkerController) -> None:
        if not self._ordered:  # the queue is complete by the first assignment
            self._ordered = True
            for scope in [s for s in self.workqueue if s.startswith(FIRST)][::-1]:
                self.workqueue.move_to_end(scope, last=False)
        super()._assign_work_unit(node)
