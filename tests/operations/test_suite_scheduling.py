"""The suite's own scheduling (tests/suite_scheduling.py): the units marked `starts_first` reach
pytest-xdist's scheduler under their group's name, parametrized tests' included, and are handed out
before the rest."""

from __future__ import annotations

from types import SimpleNamespace

import suite_scheduling
from xdist.remote import Producer
from xdist.scheduler.loadgroup import LoadGroupScheduling

PARAMETRIZED = "tests/faults/test_faults.py::test_a_bounded_fault_campaign_keeps_every_promise[local]"


def test_a_parametrized_test_keeps_its_starts_first_group() -> None:
    node_id = f"{PARAMETRIZED}@{suite_scheduling.first_group(PARAMETRIZED)}"
    scope = LoadGroupScheduling._split_scope(None, node_id)  # type: ignore[arg-type]
    assert scope.startswith(suite_scheduling.FIRST), scope


class Node:
    def __init__(self, name: str) -> None:
        self.gateway, self.shutting_down, self.sent = SimpleNamespace(id=name), False, []

    def send_runtest_some(self, indexes: list[int]) -> None:
        self.sent.extend(indexes)

    def shutdown(self) -> None:
        self.shutting_down = True


def test_the_starts_first_units_go_out_before_bigger_ones() -> None:
    ids = [f"tests/control/test_many.py::test_{n}" for n in range(9)]  # one big unit (9 tests)
    ids += [f"tests/data/test_more.py::test_{n}@tests/data" for n in range(5)]
    ids += [f"{PARAMETRIZED}@{suite_scheduling.first_group(PARAMETRIZED)}"]
    option = SimpleNamespace(loadscopereorder=True, maxworkerrestart=None, numprocesses=2)
    config = SimpleNamespace(option=option, getvalue=lambda name: "loadgroup")
    scheduler = suite_scheduling.StartsFirst(config, Producer("suite", enabled=False))  # type: ignore[arg-type]
    scheduler.numnodes = 2
    nodes = [Node("gw0"), Node("gw1")]
    for node in nodes:
        scheduler.add_node(node)  # type: ignore[arg-type]
        scheduler.add_node_collection(node, ids)  # type: ignore[arg-type]
    scheduler.schedule()
    assert ids[nodes[0].sent[0]].startswith(PARAMETRIZED)  # the first unit handed out
