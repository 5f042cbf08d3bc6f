"""JobSpec: the documented example is valid; every bad input names its field and rule."""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml
from gpuyard.domain.feasibility import TeamQuota, check_data_sites, check_feasible, check_quota
from gpuyard.domain.fleet import Fleet, Node
from gpuyard.domain.spec import JobSpec, SpecRejected, parse_spec
from hypothesis import given, settings
from hypothesis import strategies as st

from .conftest import EXAMPLE_SPEC

EXAMPLE_YAML = """
name: flights-delay
team: a
image: python:3.11-slim
command: ["python", "-m", "training.run", "--config", "pipelines/flights_delay/pipeline.yaml"]
resources: {gpus: 1, gpu_types: [cpu], nodes: 1}
priority: normal
preemptible: true
retry: {max_failures: 2}
checkpoint: {url: "file:///tmp/gpuyard-ckpt/flights", interval: auto}
"""

# Two sites; the biggest fast domain is 2 nodes x 8 a100 GPUs, 96 CPUs and 512 GiB each; the t4
# nodes do not say their CPU and memory.
FLEET = Fleet(
    nodes=tuple(
        Node(
            name=f"{site}-{domain}-{i}",
            site=site,
            cluster="c1",
            domain=domain,
            gpu_type=gpu_type,
            gpus=gpus,
            gpu_memory_gb=memory,
            cpu=cpu,
            memory_gb=host_memory,
        )
        for site, domain, gpu_type, gpus, memory, cpu, host_memory, count in [
            ("east", "rack1", "a100", 8, 80, 96, 512, 2),
            ("east", "rack2", "a100", 8, 80, 32, 1024, 1),
            ("west", "rack1", "t4", 4, 16, None, None, 4),
        ]
        for i in range(count)
    )
)


def violations(data: dict[str, Any]) -> dict[str, str]:
    with pytest.raises(SpecRejected) as caught:
        parse_spec(data)
    return {v.path: v.rule for v in caught.value.violations}


def with_(**changes: Any) -> dict[str, Any]:
    return {**EXAMPLE_SPEC, **changes}


def test_the_documented_example_is_valid_in_yaml_and_json() -> None:
    from_yaml = parse_spec(yaml.safe_load(EXAMPLE_YAML))
    from_json = parse_spec(json.loads(json.dumps(EXAMPLE_SPEC)))
    assert from_yaml == from_json
    assert from_yaml.resources.gpus_per_node == 1
    assert from_yaml.checkpoint is not None and from_yaml.checkpoint.interval_seconds is None
    assert from_yaml.fingerprint() == from_json.fingerprint()


def test_spec_is_immutable() -> None:
    spec = parse_spec(EXAMPLE_SPEC)
    with pytest.raises(Exception, match="frozen"):
        spec.name = "other"  # type: ignore[misc]


@pytest.mark.parametrize(
    ("data", "path", "fragment"),
    [
        (with_(colour="blue"), "colour", "Extra inputs"),
        (with_(resources={"gpus": 1, "gpu": 2}), "resources.gpu", "Extra inputs"),
        (with_(resources={"memory": "16GB"}), "resources.memory", "'16Gi'"),
        (with_(resources={"cpu": "four"}), "resources.cpu", "CPU amount"),
        (with_(resources={"gpus": "1"}), "resources.gpus", "integer"),
        (with_(resources={"gpus": -1}), "resources.gpus", "greater than or equal"),
        (with_(resources={"gpus": 9, "nodes": 2}), "resources", "split evenly"),
        (with_(resources={"gpus": {"min": 0, "max": 4}}), "resources.gpus", "1 <= min <= max"),
        (with_(resources={"gpus": {"min": 4, "max": 2}}), "resources.gpus", "got min 4 and max 2"),
        (with_(resources={"gpus": {"min": 1}}), "resources.gpus", "{min: N, max: M}, got the keys ['min']"),
        (with_(resources={"gpus": {"min": 1, "max": "8"}}), "resources.gpus", "max: expected an integer"),
        (with_(resources={"gpus": {"min": 1, "max": 5000}}), "resources.gpus", "<= 4096"),
        (with_(resources={"gpus": True}), "resources.gpus", "integer"),
        (with_(resources={"gpus": {"min": 2, "max": 9}, "nodes": 2}), "resources", "(max 9) must split"),
        (with_(checkpoint={"url": "/tmp/x"}), "checkpoint.url", "scheme"),
        (with_(checkpoint={"url": "file:///x", "interval": "10 minutes"}), "checkpoint.interval", "duration"),
        (with_(priority="urgent"), "priority", "'low', 'normal' or 'high'"),
        (with_(name="Flights_Delay"), "name", "DNS label"),
        (with_(command=[]), "command", "at least 1"),
        (with_(env={"GPUYARD_ATTEMPT_ID": "x"}), "env", "reserved"),
        (with_(retry={"max_failures": 2, "backof": "1s"}), "retry.backof", "Extra inputs"),
    ],
)
def test_bad_input_names_field_and_rule(data: dict[str, Any], path: str, fragment: str) -> None:
    found = violations(data)
    assert path in found, found
    assert fragment in found[path]


def test_an_elastic_range_is_launched_at_its_min_and_round_trips() -> None:
    """`gpus: {min, max}`: `gpus` stays the int the job is launched with (its min), every consumer of
    it reading the size placed; `gpus_max` is the most it may hold; its sizes split over its nodes."""
    spec = parse_spec(with_(resources={"gpus": {"min": 2, "max": 8}, "nodes": 2}))
    res = spec.resources
    assert (res.gpus, res.gpus_max, res.gpus_per_node) == (2, 8, 1)
    assert res.sizes == (2, 4, 6, 8) and res.elastic
    dumped = json.loads(spec.canonical_json())
    assert dumped["resources"]["gpus"] == {"min": 2, "max": 8}  # as written
    assert parse_spec(dumped) == spec and parse_spec(dumped).fingerprint() == spec.fingerprint()
    fixed = parse_spec(with_(resources={"gpus": 4})).resources
    assert (fixed.gpus, fixed.gpus_max, fixed.sizes, fixed.elastic) == (4, 4, (4,), False)
    one_size = parse_spec(with_(resources={"gpus": {"min": 4, "max": 4}})).resources
    assert not one_size.elastic and one_size.sizes == (4,)
    schema = JobSpec.model_json_schema()
    assert {"$ref": "#/$defs/GpuRange"} in schema["$defs"]["Resources"]["properties"]["gpus"]["anyOf"]


def test_an_elastic_job_is_admitted_on_its_max() -> None:
    """The quota's max_gpus_per_job and the fleet are checked against the most the job may hold."""
    elastic = parse_spec(with_(resources={"gpus": {"min": 1, "max": 4}, "gpu_types": ["a100"]}))
    found = {v.path: v.rule for v in check_quota(elastic, TeamQuota(max_gpus_per_job=2))}
    assert found["resources.gpus"].endswith("at most 2 GPUs per job, asked for a range up to 4")
    assert check_quota(elastic, TeamQuota(max_gpus_per_job=4)) == []
    assert check_feasible(elastic, FLEET) == []
    too_big = parse_spec(with_(resources={"gpus": {"min": 1, "max": 16}, "gpu_types": ["a100"]}))
    rule = {v.path: v.rule for v in check_feasible(too_big, FLEET)}["resources.gpus"]
    assert rule.startswith("16 GPUs over 1 node(s) needs 16 GPUs per node")
    across = parse_spec(with_(resources={"gpus": {"min": 3, "max": 24}, "gpu_types": ["a100"], "nodes": 3}))
    assert [v.path for v in check_feasible(across, FLEET)] == ["resources.nodes"]


def test_several_violations_are_reported_together() -> None:
    found = violations(with_(colour="blue", priority="urgent", resources={"memory": "lots"}))
    assert set(found) == {"colour", "priority", "resources.memory"}


def test_not_a_mapping_is_rejected() -> None:
    with pytest.raises(SpecRejected, match="mapping"):
        parse_spec(["name", "x"])


@pytest.mark.parametrize(
    ("resources", "path", "fragment"),
    [
        (
            {"gpus": 9, "gpu_types": ["a100"], "nodes": 1},
            "resources.gpus",
            "largest node of the accepted types has 8",
        ),
        ({"gpus": 24, "gpu_types": ["a100"], "nodes": 3}, "resources.nodes", "ONE fast domain"),
        ({"gpus": 1, "gpu_types": ["h100"]}, "resources.gpu_types", "no node in the fleet"),
        ({"gpus": 1, "gpu_types": ["t4"], "gpu_memory": "40Gi"}, "resources.gpu_memory", "40 GiB"),
        ({"gpus": 8, "gpu_types": ["a100"], "cpu": 128}, "resources.cpu", "128 CPUs per node; the most any"),
        ({"gpus": 8, "gpu_types": ["a100"], "memory": "2Ti"}, "resources.memory", "2048 GiB of memory"),
        # each resource alone fits a node, but no node has both, nor a domain two such nodes
        (
            {"gpus": 8, "gpu_types": ["a100"], "cpu": 64, "memory": "600Gi"},
            "resources.nodes",
            "ONE fast domain",
        ),
        (
            {"gpus": 16, "gpu_types": ["a100"], "nodes": 2, "memory": "600Gi"},
            "resources.nodes",
            "ONE fast domain",
        ),
    ],
)
def test_requests_the_fleet_can_never_offer_are_rejected(
    resources: dict[str, Any], path: str, fragment: str
) -> None:
    spec = parse_spec(with_(resources=resources))
    found = {v.path: v.rule for v in check_feasible(spec, FLEET)}
    assert path in found, found
    assert fragment in found[path]


def test_a_gang_that_fits_one_domain_is_feasible() -> None:
    spec = parse_spec(with_(resources={"gpus": 16, "gpu_types": ["a100"], "nodes": 2}))
    assert check_feasible(spec, FLEET) == []
    roomy = parse_spec(
        with_(resources={"gpus": 16, "gpu_types": ["a100"], "nodes": 2, "cpu": 90, "memory": "500Gi"})
    )
    assert check_feasible(roomy, FLEET) == []
    unknown = parse_spec(with_(resources={"gpus": 4, "gpu_types": ["t4"], "cpu": 500}))
    assert check_feasible(unknown, FLEET) == []  # nodes that do not say are not held to it
    pinned = parse_spec(with_(resources={"gpus": 4, "gpu_types": ["a100"]}, sites=["west"]))
    assert [v.path for v in check_feasible(pinned, FLEET)] == ["sites"]


def test_a_data_input_may_carry_its_size_and_the_sites_holding_it() -> None:
    spec = parse_spec(
        with_(
            data=[
                {"uri": "s3://lake-east/flights/", "size": "40G", "sites": ["east"]},
                {"uri": "s3://lake/ref/", "size": "1.5Ti", "sites": ["east", "west"]},
                {"uri": "s3://lake/out/", "access": "write", "size": 1024},
                {"uri": "s3://lake/old/"},  # as before: no size, no site
            ]
        )
    )
    assert [(d.size_bytes, d.sites) for d in spec.data] == [
        (40 * 10**9, ("east",)),
        (int(1.5 * 2**40), ("east", "west")),
        (1024, ()),
        (None, ()),
    ]
    assert parse_spec(json.loads(spec.canonical_json())) == spec
    assert check_data_sites(spec, FLEET) == []
    bad = violations(
        with_(
            data=[
                {"uri": "s3://a/", "size": "40 GB"},
                {"uri": "s3://b/", "size": -1},
                {"uri": "s3://c/", "size": True},
                {"uri": "s3://d/", "sites": ["east", "east"]},
                {"uri": "s3://e/", "sites": ["East"]},
                {"uri": "s3://f/", "size": 1.5},  # a float crashed the byte parser (a 500 at the API)
            ]
        )
    )
    assert bad == {
        "data.0.size": "expected a byte quantity such as '16Gi' or '512Mi', got '40 GB'",
        "data.1.size": "expected a non-negative byte count, got -1",
        "data.2.size": "expected a string or a number, got bool",
        "data.3.sites": "a site is named twice: ['east', 'east']",
        "data.4.sites.0": "expected a lowercase DNS label (a-z, 0-9, '-', at most 63 characters), got 'East'",
        "data.5.size": "expected a byte quantity such as '16Gi' or '512Mi', got 1.5",
    }
    misspelt = parse_spec(with_(data=[{"uri": "s3://a/", "sites": ["west", "eest"]}]))
    assert {v.path: v.rule for v in check_data_sites(misspelt, FLEET)} == {
        "data.0.sites": "the fleet has no site 'eest'; its sites: ['east', 'west']"
    }


def test_quota_limits_gpus_per_job_and_types() -> None:
    spec = parse_spec(with_(resources={"gpus": 4, "gpu_types": ["a100", "t4"]}))
    quota = TeamQuota(max_gpus_per_job=2, allowed_gpu_types=("t4",))
    found = {v.path: v.rule for v in check_quota(spec, quota)}
    assert "at most 2 GPUs" in found["resources.gpus"]
    assert "['a100']" in found["resources.gpu_types"]
    assert check_quota(parse_spec(with_(resources={"gpus": 1})), quota) == []


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-10, 10**6) | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=12), children, max_size=4)
    ),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None)
@given(
    st.fixed_dictionaries(
        {},
        optional={key: json_values for key in JobSpec.model_fields},
    )
)
def test_any_document_is_accepted_or_rejected_with_paths(data: dict[str, Any]) -> None:
    try:
        spec = parse_spec(data)
    except SpecRejected as rejected:
        assert rejected.violations
        assert all(v.path and v.rule for v in rejected.violations)
    else:
        assert parse_spec(json.loads(spec.canonical_json())) == spec


@settings(max_examples=200, deadline=None)
@given(
    gpus_per_node=st.integers(0, 16),
    nodes=st.integers(1, 8),
    memory=st.sampled_from([None, "512Mi", "16Gi", 1024, "1.5Ti"]),
    interval=st.sampled_from(["auto", "30s", "10m", "2h", 90]),
    priority=st.sampled_from(["low", "normal", "high"]),
)
def test_valid_specs_round_trip(
    gpus_per_node: int, nodes: int, memory: Any, interval: Any, priority: str
) -> None:
    data = with_(
        resources={"gpus": gpus_per_node * nodes, "nodes": nodes, "memory": memory},
        checkpoint={"url": "s3://bucket/ckpt", "interval": interval},
        priority=priority,
    )
    spec = parse_spec(data)
    assert spec.resources.gpus_per_node == gpus_per_node
    again = parse_spec(json.loads(spec.canonical_json()))
    assert again == spec and again.fingerprint() == spec.fingerprint()
