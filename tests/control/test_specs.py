"""store/specs.py: the spec cache a reader owns holds what it still reads, within its cap."""

from __future__ import annotations

import pytest
from gpuyard.domain.spec import parse_spec
from gpuyard.store.specs import SpecCache

from .conftest import EXAMPLE_SPEC


def raw(name: str) -> dict[str, object]:
    return parse_spec({**EXAMPLE_SPEC, "name": name}).model_dump(mode="json")


def test_a_spec_is_validated_once_while_it_is_read() -> None:
    cache = SpecCache()
    first = cache.get("job-1", "h1", raw("a"))
    assert cache.get("job-1", "h1", raw("a")) is first and first.name == "a"
    assert cache.get("job-1", "h2", raw("b")) is not first  # another hash: validated anew


def test_a_sweep_drops_what_was_not_read_since_the_last() -> None:
    cache = SpecCache()
    for i in range(3):
        cache.get(f"job-{i}", "h", raw(f"j{i}"))
    assert cache.sweep() == 0 and cache.job_ids() == {"job-0", "job-1", "job-2"}  # all read since
    cache.get("job-1", "h", raw("j1"))  # the next pass reads job-1 only: the others ended
    assert cache.sweep() == 2 and cache.job_ids() == {"job-1"}
    assert cache.sweep() == 1 and len(cache) == 0


def test_it_never_holds_more_than_its_cap_and_drops_the_least_recently_read() -> None:
    cache = SpecCache(max_entries=3)
    spec = raw("x")
    for i in range(100):
        cache.get(f"job-{i}", "h", spec)
        cache.get("job-0", "h", spec)  # read every time: kept
        assert len(cache) <= 3
    assert cache.job_ids() == {"job-0", "job-98", "job-99"}
    with pytest.raises(ValueError, match="at least 1"):
        SpecCache(max_entries=0)
