"""The runtime trains the transformer (training/workloads.py) in the layouts of training/layouts.py:

- the config's rules for the model kinds and their strategies, each error naming its field;
- `strategy: auto`: the planner's plan mapped to a layout of the registry (`layouts.from_plan`);
- gangs of 2 gloo CPU ranks through the real entry point (`python -m training.run`): a run in one
  layout, preempted (SIGTERM), resumes from its checkpoint with `strategy: auto` in the layout the
  planner chooses, and continues as the same steps in one process do, within a relative 1e-5 per
  step; it logs the full model, gathered from that layout, to MLflow.
"""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from trainkit import REPO, launch, losses, read_events, run_workers

from training import exit_codes, planner
from training.config import Config, ConfigError, from_dict, load
from training.layouts import LayoutSpec, from_plan
from training.planner import Layout
from training.trainer import lr_lambda
from training.transformer import Transformer, TransformerSpec, next_token_loss
from training.workloads import check, check_layout, plan_layout, step_tokens

TOLERANCE = 1e-5  # relative, per step (test_layouts.py's)
MODEL = {"kind": "transformer", "vocab": 64, "width": 32, "heads": 4, "layers": 2, "seq_len": 16}
MAX_STEPS = 8


def configured(raw: dict[str, Any]) -> Config:
    """The config with its fields' rules and its model kind's (as the runtime loads it)."""
    cfg = from_dict(raw)
    check(cfg)
    return cfg


def transformer(**sections: dict[str, Any]) -> dict[str, Any]:
    raw: dict[str, Any] = {"model": dict(MODEL), "train": {"global_batch_size": 8}}
    for section, values in sections.items():
        raw.setdefault(section, {}).update(values)
    return raw


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        ({"data": {"path": "/d"}, "parallel": {"strategy": "tp"}}, "parallel.strategy"),  # the MLP: ddp, fsdp
        (transformer(parallel={"strategy": "zero"}), "parallel.strategy"),  # no such layout
        (transformer(model={"kind": "cnn"}), "model.kind"),
        ({"model": {"kind": "mlp"}}, "data.path"),  # the MLP needs its training set
        (transformer(data={"path": "/d"}), "data.path"),  # the transformer reads none
        (transformer(model={"width": 30}), "model.width"),  # not a multiple of the heads
        (transformer(parallel={"strategy": "fsdp_tp", "tp": 3}), "parallel.tp"),  # 3 does not divide 4 heads
        (transformer(parallel={"strategy": "fsdp_tp"}), "parallel.tp"),  # its group size is needed
        (transformer(parallel={"strategy": "ddp", "tp": 2}), "parallel.tp"),  # only fsdp_tp takes it
        (transformer(parallel={"strategy": "pp_dp", "pp": 4}), "parallel.pp"),  # 4 stages of 2 layers
        (transformer(parallel={"strategy": "auto", "micro_batches": 4}), "parallel.micro_batches"),
        (transformer(parallel={"strategy": "pp", "schedule": "zigzag"}), "parallel.schedule"),
        (transformer(parallel={"strategy": "auto", "gpus_per_node": 0}), "parallel.gpus_per_node"),
    ],
)
def test_the_config_rules_name_the_field(raw: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigError, match=rf"^{field}"):
        configured(raw)


def test_every_layout_and_the_pipeline_config_load() -> None:
    named: list[tuple[str, dict[str, Any]]] = [
        ("ddp", {}),
        ("fsdp", {}),
        ("tp", {}),
        ("pp", {"micro_batches": 4, "schedule": "gpipe"}),
        ("fsdp_tp", {"tp": 2}),
        ("pp_dp", {"pp": 2}),
        ("auto", {"gpus_per_node": 8, "inter_node_gbps": 12.5}),
    ]
    for name, extra in named:
        cfg = configured(transformer(parallel={"strategy": name, **extra}))
        assert cfg.parallel.strategy == name and cfg.data.path is None
    flights = load(REPO / "pipelines/flights_delay/pipeline.yaml", ["data.path=/d"])
    check(flights)
    assert flights.model.kind == "mlp" and flights.parallel.strategy == "auto"


@pytest.mark.parametrize(
    ("spec", "ranks", "batch", "field"),
    [
        (LayoutSpec("tp"), 3, 8, "parallel.strategy tp on 3 ranks: .* model.heads"),
        (LayoutSpec("fsdp_tp", tp=2), 3, 6, "parallel.tp"),
        (LayoutSpec("ddp"), 4, 6, "train.global_batch_size"),
        (LayoutSpec("pp"), 4, 8, "parallel.strategy pp on 4 ranks: 4 pipeline stages"),
        (LayoutSpec("pp", micro_batches=3), 2, 8, "parallel.micro_batches"),
        (LayoutSpec("pp_dp", pp=2, micro_batches=1), 4, 8, "parallel.micro_batches"),
    ],
)
def test_a_layout_that_does_not_split_the_gang_is_refused_naming_the_field(
    spec: LayoutSpec, ranks: int, batch: int, field: str
) -> None:
    model = configured(transformer()).model
    with pytest.raises(ConfigError, match=rf"^{field}"):
        check_layout(spec, model, ranks, batch)
    check_layout(LayoutSpec("fsdp"), model, 2, 8)  # and one that does passes


@pytest.mark.parametrize(
    ("plan", "expected"),
    [
        (Layout(4, False, 1, 1, False, 1), LayoutSpec("ddp")),
        (Layout(4, True, 1, 1, False, 1), LayoutSpec("fsdp")),
        (Layout(1, False, 4, 1, False, 4), LayoutSpec("tp")),
        (Layout(2, True, 2, 1, False, 2), LayoutSpec("fsdp_tp", tp=2)),
        (Layout(2, False, 2, 1, False, 2), LayoutSpec("fsdp_tp", tp=2)),  # its replicas sharded
        (Layout(1, False, 1, 4, False, 8), LayoutSpec("pp", micro_batches=8, schedule="gpipe")),
        (Layout(2, True, 1, 2, False, 4), LayoutSpec("pp_dp", pp=2, micro_batches=4, schedule="gpipe")),
        (Layout(2, False, 1, 2, False, 4), LayoutSpec("pp_dp", pp=2, micro_batches=4, schedule="gpipe")),
    ],
)
def test_a_plan_maps_to_the_layout_that_runs_it(plan: Layout, expected: LayoutSpec) -> None:
    assert from_plan(plan, "gpipe") == expected


@pytest.mark.parametrize(
    ("plan", "named"),
    [
        (Layout(2, True, 2, 2, False, 4), "dp=2, fsdp=True, tp=2, pp=2 \\(tensor x pipeline parallel\\)"),
        (Layout(4, True, 1, 1, True, 1), "dp=4, fsdp=True, tp=1, pp=1 needs activation checkpointing"),
    ],
)
def test_a_plan_the_runtime_cannot_run_is_refused_naming_it(plan: Layout, named: str) -> None:
    with pytest.raises(ConfigError, match=f"parallel.strategy auto: .*{named}"):
        from_plan(plan)


def test_auto_asks_the_planner_for_the_model_the_gang_and_its_links() -> None:
    cfg = configured(transformer(parallel={"strategy": "auto", "intra_node_gbps": 100.0}))
    n = sum(p.numel() for p in Transformer(TransformerSpec(64, 32, 4, 2, 16)).parameters())
    shape = planner.ModelShape(float(n), 2, 32, 4, 64, 16)
    train = planner.Training(micro_batch=2, global_batch=8, optimizer="adamw", precision="fp32")
    for env, fleet in [
        ({}, planner.Fleet(16.0, gpus_per_node=4, nodes=1, intra_node_gbps=100.0)),
        ({"LOCAL_WORLD_SIZE": "2"}, planner.Fleet(16.0, gpus_per_node=2, nodes=2, intra_node_gbps=100.0)),
    ]:
        result = planner.plan(shape, train, fleet)
        layout, reason = plan_layout(cfg, n, 4, 16.0, env)
        assert layout == from_plan(result.layout) and reason.endswith("; ".join(result.reasons))
    with pytest.raises(ConfigError, match=r"^parallel\.gpus_per_node: 3 does not divide"):
        plan_layout(
            configured(transformer(parallel={"strategy": "auto", "gpus_per_node": 3})), n, 4, 16.0, {}
        )
    with pytest.raises(ConfigError, match=r"^train\.global_batch_size"):
        plan_layout(cfg, n, 3, 16.0, {})
    with pytest.raises(ConfigError, match=r"^parallel\.strategy auto: does not fit"):
        plan_layout(cfg, n, 4, 1.0, {})  # less than the planner's 2 GB reserve per device


# --- gangs of the real runtime --------------------------------------------------------------------------


def write_config(root: Path, name: str, **sections: dict[str, Any]) -> tuple[Path, Path]:
    workdir = root / name
    raw = transformer(
        train={"max_steps": MAX_STEPS, "global_batch_size": 8, "lr": 0.01, "warmup_steps": 2},
        checkpoint={"interval_steps": 4, "keep_last": 3},
        mlflow={"enabled": False},
    )
    raw |= {"seed": 7, "workdir": str(workdir)}
    for section, values in sections.items():
        raw.setdefault(section, {}).update(values)
    path = root / f"{name}.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path, workdir


def reference_losses(cfg: Config) -> list[float]:
    """The run's steps in one process without torch.distributed: the same model from the seed, the
    same batches (`step_tokens`), optimizer and learning-rate schedule."""
    m = cfg.model
    spec = TransformerSpec(m.vocab, m.width, m.heads, m.layers, m.seq_len)
    torch.manual_seed(cfg.seed)
    model = Transformer(spec)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.train.lr, weight_decay=cfg.train.weight_decay)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(cfg))
    out = []
    for step in range(cfg.train.max_steps):
        tokens = step_tokens(spec, cfg.train.global_batch_size, cfg.seed, step)
        optimizer.zero_grad(set_to_none=True)
        loss = next_token_loss(model(tokens), tokens)
        loss.backward()
        optimizer.step()
        scheduler.step()
        out.append(loss.item())
    assert out[-1] < out[0]  # it learns: the comparisons are not of untrained noise
    return out


def assert_as_one_process(workdir: Path, reference: list[float]) -> None:
    found = losses(read_events(workdir))
    assert sorted(found) == list(range(1, MAX_STEPS + 1))
    gaps = [abs(found[step + 1] - expected) / expected for step, expected in enumerate(reference)]
    assert max(gaps) <= TOLERANCE, f"{found} against one process's {reference}"


def start_event(workdir: Path) -> dict[str, Any]:
    return [e for e in read_events(workdir) if e["event"] == "start"][-1]


@pytest.mark.slow
def test_a_run_preempted_in_one_layout_resumes_in_the_layout_auto_chooses(tmp_path: Path) -> None:
    """Saved by one layout on 2 ranks at a preemption (SIGTERM), resumed by `strategy: auto` on 2 in the
    layout the planner chooses: the same steps as one process, and the full model, gathered from
    however the layout holds it, logged to MLflow with the strategy and the planner's reasons."""
    n = sum(p.numel() for p in Transformer(TransformerSpec(64, 32, 4, 2, 16)).parameters())
    shape = planner.ModelShape(float(n), 2, 32, 4, 64, 16)
    # 2 ranks on one node, each a CPU rank of 16 GB, the planner's links; one micro-batch per rank
    result = planner.plan(shape, planner.Training(4, 8, "adamw", "fp32"), planner.Fleet(16.0, 2, 1))
    chosen = from_plan(result.layout)
    first = "fsdp" if chosen.name == "tp" else "tp"  # so that the resume crosses layouts
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    config, work = write_config(
        tmp_path,
        "resumed",
        parallel={"strategy": "auto"},
        mlflow={"enabled": True, "tracking_uri": uri, "experiment": "lm", "system_metrics": False},
    )
    overrides = [f"parallel.strategy={first}", "train.step_sleep_s=0.3", "mlflow.enabled=false"]
    preempted = launch(config, 2, work, overrides=overrides)
    preempted.wait_for(lambda events: any(e["event"] == "step" and e["step"] >= 2 for e in events))
    preempted.signal(signal.SIGTERM)
    assert preempted.wait() == [exit_codes.PREEMPTED] * 2, preempted.output()
    stopped = next(e for e in read_events(work) if e["event"] == "exit")["step"]
    assert 2 <= stopped < MAX_STEPS and start_event(work)["strategy"] == first

    assert run_workers(config, 2, work) == [exit_codes.SUCCESS] * 2
    resume = next(e for e in read_events(work) if e["event"] == "resume")
    assert resume["step"] == stopped and resume["saved_world_size"] == 2
    start = start_event(work)
    assert start["model"] == "transformer" and start["strategy"] == chosen.name
    assert start["strategy_reason"].endswith("; ".join(result.reasons))
    assert_as_one_process(work, reference_losses(load(config)))
    checkpoint = [e for e in read_events(work) if e["event"] == "checkpoint"][-1]
    assert checkpoint["step"] == MAX_STEPS and checkpoint["metrics"]["val_loss"] > 0

    import mlflow
    from mlflow.tracking import MlflowClient

    from training.checkpoint import CheckpointStore, read_model_state

    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("lm")
    assert experiment is not None
    (run,) = client.search_runs([experiment.experiment_id])
    assert run.data.tags["gpuyard.strategy"] == chosen.name
    assert run.data.tags["gpuyard.strategy_reason"] == start["strategy_reason"]
    (logged,) = client.search_logged_models([experiment.experiment_id])
    mlflow.set_tracking_uri(uri)
    exported = mlflow.pytorch.load_model(f"models:/{logged.model_id}").state_dict()
    store = CheckpointStore((work / "checkpoints").as_uri())
    final = read_model_state(store.step_url(MAX_STEPS))
    assert exported.keys() == final.keys()  # every parameter, under the full model's names
    assert all(torch.equal(exported[name], final[name]) for name in final)
