"""Parallelism planner: published memory figures, measured memory on CPU, the CLI contract."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys

import pytest
import typer
from typer.testing import CliRunner

from training.planner import (
    Fleet,
    Layout,
    ModelShape,
    PlanError,
    Training,
    activation_bytes_per_layer,
    infer_shape,
    memory,
    model_state_bytes,
    plan,
    runtime_strategy,
)
from training.planner_cli import plan as plan_command


def cli() -> typer.Typer:
    app = typer.Typer()
    app.command("plan")(plan_command)
    app.command("noop")(lambda: None)  # two commands, so "plan" is addressed by name as in `gpuyard plan`
    return app


@pytest.mark.parametrize(("stage", "expected_gb"), [(0, 120.0), (1, 31.4), (2, 16.6), (3, 1.9)])
def test_model_states_match_the_zero_paper(stage: int, expected_gb: float) -> None:
    """ZeRO (Rajbhandari et al. 2020), Figure 1: 7.5B parameters, mixed-precision Adam, 64 GPUs."""
    total = sum(model_state_bytes(7.5e9, "adam", "fp16", shards=64, zero_stage=stage).values()) / 1e9
    assert total == pytest.approx(expected_gb, rel=0.02)


def test_activations_match_korthikanti_formula() -> None:
    """GPT-3 175B layer (h=12288, a=96, s=2048), micro-batch 1, t=8, no flash attention:
    s*b*h*(34 + 5*a*s/h)/t bytes."""
    shape = ModelShape(175e9, 96, 12288, 96, 51200, 2048)
    expected = 2048 * 12288 * (34 + 5 * 96 * 2048 / 12288) / 8
    assert activation_bytes_per_layer(shape, 1, 8, False, "bf16") == pytest.approx(expected)
    assert activation_bytes_per_layer(shape, 1, 8, True, "bf16") == pytest.approx(2048 * 12288 * 34 / 8)


def test_seventy_billion_on_64_gpus_shards_and_fits() -> None:
    result = plan(infer_shape(70e9, 4096), Training(micro_batch=1), Fleet(80, 8, 8))
    s = result.strategy
    assert int(s["dp"]) * int(s["tp"]) * int(s["pp"]) == 64
    assert 1 < int(s["tp"]) <= 8 or s["fsdp"], "70B cannot be replicated on 80 GB GPUs"
    assert result.per_gpu_memory_gb["total"] <= 80
    assert result.per_gpu_memory_gb["optimizer_state"] < 1120 / 8


def test_small_model_gets_plain_ddp() -> None:
    result = plan(infer_shape(1e9, 2048), Training(micro_batch=1), Fleet(80, 8, 1))
    assert result.strategy == {"dp": 8, "fsdp": False, "tp": 1, "pp": 1}
    assert not result.activation_checkpointing
    assert any("DDP" in r for r in result.reasons)


def test_memory_pressure_turns_on_sharding_then_checkpointing() -> None:
    shape = ModelShape(6.7e9, 32, 4096, 32, 32000, 4096)  # Llama-2-7B-like
    roomy = plan(shape, Training(micro_batch=1), Fleet(80, 8, 1))
    tight = plan(shape, Training(micro_batch=16), Fleet(24, 8, 1))
    assert roomy.strategy["fsdp"] or int(roomy.strategy["tp"]) > 1  # 107 GB of state: must be split
    assert tight.per_gpu_memory_gb["total"] <= 24
    full = memory(shape, Training(micro_batch=16), Fleet(24, 8, 1), Layout(8, True, 1, 1, False, 1))
    assert full["total"] > 24  # so the tight plan had to do something beyond FSDP alone
    assert tight.activation_checkpointing or int(tight.strategy["tp"]) > 1 or int(tight.strategy["pp"]) > 1


def test_impossible_request_is_refused_with_the_reason() -> None:
    with pytest.raises(PlanError, match="does not fit"):
        plan(infer_shape(1e12, 2048), Training(), Fleet(16, 1, 1))


def test_runtime_strategy_switches_to_fsdp_when_state_is_large() -> None:
    assert runtime_strategy(1_000_000, 16, 2)[0] == "ddp"
    assert runtime_strategy(1_000_000_000, 16, 2)[0] == "fsdp"  # 16 GB of fp32 AdamW state
    assert runtime_strategy(1_000_000_000, 16, 1)[0] == "ddp"  # nothing to shard over


def test_cli_json_for_the_documented_example() -> None:
    args = "plan --params 70e9 --gpu-memory-gb 80 --gpus-per-node 8 --nodes 8 --seq-len 4096 --micro-batch 1"
    result = CliRunner().invoke(cli(), [*shlex.split(args), "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert set(out["strategy"]) == {"dp", "fsdp", "tp", "pp"}
    assert {"parameters", "gradients", "optimizer_state", "activations", "total"} <= set(
        out["per_gpu_memory_gb"]
    )
    assert out["reasons"] and all(isinstance(r, str) for r in out["reasons"])


def test_cli_refuses_impossible_request_with_exit_code_2() -> None:
    result = CliRunner().invoke(
        cli(), ["plan", "--params", "1e12", "--gpu-memory-gb", "16", "--gpus-per-node", "1"]
    )
    assert result.exit_code == 2
    assert "does not fit" in result.stderr


def test_cli_gpu_type_sets_memory() -> None:
    args = ["plan", "--params", "13e9", "--gpu-type", "a10g", "--gpus-per-node", "1"]
    small = CliRunner().invoke(cli(), args)
    assert small.exit_code == 2 and "24 GB" in small.stderr
    big = CliRunner().invoke(
        cli(), ["plan", "--params", "13e9", "--gpu-type", "h200", "--gpus-per-node", "8", "--json"]
    )
    assert big.exit_code == 0, big.output
    assert json.loads(big.stdout)["per_gpu_memory_gb"]["total"] <= 141
    unknown = CliRunner().invoke(cli(), ["plan", "--params", "1e9", "--gpu-type", "tpu"])
    assert unknown.exit_code == 2 and "--gpu-type" in unknown.stderr


def test_cli_text_output_with_a_model_config() -> None:
    result = CliRunner().invoke(
        cli(),
        shlex.split("plan --layers 32 --hidden 4096 --heads 32 --seq-len 4096 --gpus-per-node 8"),
    )
    assert result.exit_code == 0, result.output
    assert "strategy: dp=" in result.stdout and "optimizer_state" in result.stdout


MEASURE = """
import resource, sys, psutil, torch
torch.set_num_threads(1)
width, layers = int(sys.argv[1]), int(sys.argv[2])
def step(w, n):
    model = torch.nn.Sequential(*[torch.nn.Linear(w, w) for _ in range(n)])
    opt = torch.optim.AdamW(model.parameters(), foreach=False)  # per-tensor steps: small, steady transients
    model(torch.randn(2, w)).sum().backward()
    opt.step()
    return model, opt
step(8, 2)  # warm-up: pages the kernels' code in, so only tensor memory is measured below
base = psutil.Process().memory_info().rss
kept = step(width, layers)
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
print(sum(p.numel() for p in kept[0].parameters()), peak - base, psutil.Process().memory_info().rss - base)
"""


@pytest.mark.slow
def test_model_state_estimate_matches_measured_memory_on_cpu() -> None:
    """fp32 AdamW: weights 4 + gradients 4 + two moments 8 = 16 bytes per parameter, against the resident
    memory growth of a fresh process over one training step: at steady state (tight), and at its peak
    (which also holds temporaries)."""
    out = subprocess.run(
        [sys.executable, "-c", MEASURE, "1024", "16"],
        capture_output=True,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        check=True,
        timeout=120,
    ).stdout.split()
    n_params, peak, steady = int(out[0]), int(out[1]), int(out[2])
    predicted = sum(model_state_bytes(n_params, "adamw", "fp32").values())
    # glibc's allocator keeps a few MB of slack that varies run to run (0% to +6% seen here).
    assert steady == pytest.approx(predicted, rel=0.1), (steady / 1e6, predicted / 1e6)
    # The peak holds everything the steady state does, plus transients whose size depends on the
    # allocator's mood (from +3% to +300% seen on one machine), so only its lower bound is a check.
    assert predicted <= peak * 1.02, (peak / 1e6, predicted / 1e6)
