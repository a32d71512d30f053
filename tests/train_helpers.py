"""Shared by the rufus-train tests: tiny stage runs on real shards and the check that the
adapter actually trained."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import TrainerCallback

from rufus_train.config_loading import load_stage_config
from rufus_train.runner import RunResult, run_stage
from rufus_train.stages import get_stage

TINY = {
    "max_steps": 2,
    "per_device_train_batch_size": 2,
    "save_steps": 2,
    "logging_steps": 1,
    "gradient_checkpointing": False,
    "max_rows": 8,
}


@pytest.fixture(scope="module", autouse=False)
def one_torch_thread():
    """One intra-op thread for the CPU training tests: with other jobs on the two cores, OpenMP's
    second thread spins and made generation 7x slower (measured: 16 tokens x 2 rows, 12 s vs 84 s)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


TINY_MAX_LENGTH = 160  # for the stages that truncate to max_length (GRPO and distill refuse the key)


def tiny_config(stage: str, data: Path | list[Path], out: Path, **overrides):
    folders = [str(d) for d in (data if isinstance(data, list) else [data])]
    config_class = get_stage(stage).config_class
    tiny = dict(TINY)
    if config_class.model_fields["max_length"].default is not None:
        tiny["max_length"] = TINY_MAX_LENGTH
    return load_stage_config(stage, config_class, overrides={**tiny, "data": folders, "output_dir": str(out), **overrides})


def run_tiny(stage: str, data, out: Path, **overrides) -> RunResult:
    return run_stage(tiny_config(stage, data, out, **overrides))


def assert_adapter_trained(result: RunResult, step: int = 2) -> None:
    """The checkpoint exists and every adapter tensor in it differs from its value before training."""
    assert result.global_step == step
    saved = load_file(result.output_dir / f"checkpoint-{step}" / "adapter_model.safetensors")
    before = {name.replace(".default", ""): t for name, t in result.initial_adapter.items()}
    assert saved and set(saved) == set(before), (sorted(saved)[:3], sorted(before)[:3])
    unchanged = [n for n, t in saved.items() if (t.float() - before[n].float()).abs().max().item() == 0]
    assert not unchanged, f"{len(unchanged)} of {len(saved)} adapter tensors did not change, e.g. {unchanged[:2]}"
    losses = [m["loss"] for m in result.metrics if "loss" in m]
    assert len(losses) == step and not any(math.isnan(loss) for loss in losses)  # logged every step, no NaN


class WaitForBaseline(TrainerCallback):
    """Hold step 1 until the step-0 baseline evaluation is done, so the next checkpoint is
    evaluated rather than skipped as busy (checkpoint-evaluation tests)."""

    def __init__(self, evaluator):
        self.evaluator = evaluator

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == 1:
            assert self.evaluator.wait(300), "baseline evaluation did not finish in 300 s"
