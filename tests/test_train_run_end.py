"""How a run ends when it should not train on: a run that diverges to NaN stops with a non-zero
exit and no NaN model (issue #47, item 4), and `--resume_from_checkpoint latest` on a finished
run trains nothing more (item 5). Tiny-random, a few steps each."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import example_shards
import pytest
from train_helpers import one_torch_thread, run_tiny

from rufus_data.base.errors import RufusError
from rufus_train.checkpoints import LATEST
from rufus_train.config_loading import load_stage_config
from rufus_train.divergence import DivergenceGuard, non_finite
from rufus_train.stages import get_stage

_ = one_torch_thread
REPO = Path(__file__).resolve().parents[1]
DIVERGING = {"learning_rate": 1e30, "lora.enabled": False, "max_steps": 3, "save_steps": 1, "logging_steps": 10}


@pytest.fixture(scope="module")
def shards(data_root, tmp_path_factory) -> Path:
    return example_shards.gsm8k_sft(data_root, tmp_path_factory.mktemp("sft"), limit=8, max_chars=200)


def metrics(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.train
def test_a_diverging_run_stops_saves_no_nan_model_and_says_so(shards, tiny_model, tmp_path, one_torch_thread):
    """The probe: `--learning_rate 1e30 --lora.enabled false` logged loss 0.0 beside grad_norm NaN,
    saved an all-NaN model and exited 0 ("stage sft done", "the weights barely moved")."""
    out = tmp_path / "run"
    with pytest.raises(RufusError, match=r"stage sft diverged: (loss|grad_norm) was (nan|inf|-inf) at step 2") as err:
        run_tiny("sft", shards, out, model=tiny_model, **{k: v for k, v in DIVERGING.items() if k != "lora.enabled"},
                 lora={"enabled": False})
    assert "no model was saved" in str(err.value) and "checkpoint-1, the last checkpoint before it" in str(err.value)
    assert not (out / "model.safetensors").exists()  # no result from NaN weights
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-1"]  # none of the diverged step
    logged = [m for m in metrics(out) if "grad_norm" in m]
    assert [m["step"] for m in logged] == [1, 2]  # each checkpoint step logs, though logging_steps is 10
    assert not math.isfinite(logged[-1]["loss"]) or not math.isfinite(logged[-1]["grad_norm"])
    assert logged[-1]["loss"] != 0.0  # the NaN loss is logged as NaN, not as the running average
    run = json.loads((out / "run.json").read_text())
    assert run["diverged"]["step"] == 2 and run["weight_update"] is None and "diverged" in run["warning"]
    card = (out / "README.md").read_text()
    assert "Training diverged: no model was saved" in card and "barely moved" not in card


def test_non_finite_metrics_and_every_checkpoint_step_logs():
    from types import SimpleNamespace

    assert non_finite({"loss": 0.5, "grad_norm": float("nan")})[0] == "grad_norm"
    assert non_finite({"loss": float("inf")}) == ("loss", math.inf)
    assert non_finite({"loss": 0.0, "grad_norm": 0.0, "learning_rate": 1e30}) is None
    guard = DivergenceGuard()
    control = SimpleNamespace(should_save=True, should_log=False, should_training_stop=False)
    assert guard.on_step_end(None, None, control).should_log
    state, args = SimpleNamespace(global_step=7), SimpleNamespace(learning_rate=1e-3)
    guard.on_log(args, state, control, logs={"loss": 1.0})
    assert guard.diverged is None and control.should_save and not control.should_training_stop
    guard.on_log(args, state, control, logs={"loss": float("nan")})
    assert control.should_training_stop and not control.should_save and guard.diverged["step"] == 7


@pytest.mark.spawn
def test_the_cli_exits_non_zero_when_training_diverges(shards, tiny_model, tmp_path):
    argv = [sys.executable, "-m", "rufus_train.cli", "stage", "sft", "--model", "tiny-random", "--data", str(shards),
            "--output_dir", str(tmp_path / "run"), "--max_length", "96", "--per_device_train_batch_size", "2",
            "--no-gradient_checkpointing", *(f"--{k}={v}".lower() for k, v in DIVERGING.items())]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=600, cwd=REPO, check=False)
    assert proc.returncode == 2, proc.stderr[-3000:]
    output = " ".join((proc.stdout + proc.stderr).split())
    assert "stage sft diverged" in output and "stage sft done" not in output and "Traceback" not in output


@pytest.mark.train
def test_latest_on_a_finished_run_trains_nothing_more(shards, tiny_model, tmp_path, capsys, one_torch_thread):
    """The probe: each `--resume_from_checkpoint latest` of a finished run trained one more step
    and wrote one more checkpoint (a scheduler retrying a job that succeeded over-trains it)."""
    out = tmp_path / "run"
    first = run_tiny("sft", shards, out, model=tiny_model, max_steps=2, save_steps=2)
    assert first.global_step == 2
    files = {p: p.stat().st_mtime_ns for p in out.rglob("*") if p.is_file()}
    again = run_tiny("sft", shards, out, model=tiny_model, max_steps=2, save_steps=2, resume_from_checkpoint=LATEST)
    assert again.global_step == 2 and again.trainer is None
    assert "stage sft already done" in " ".join(capsys.readouterr().err.split())
    assert {p: p.stat().st_mtime_ns for p in out.rglob("*") if p.is_file()} == files  # nothing written, nothing removed
    further = run_tiny("sft", shards, out, model=tiny_model, max_steps=3, save_steps=1, resume_from_checkpoint=LATEST)
    assert further.global_step == 3  # a higher max_steps trains on, one step
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-2", "checkpoint-3"]


@pytest.mark.train
def test_save_steps_null_writes_no_checkpoint_but_the_final_model(shards, tiny_model, tmp_path, one_torch_thread):
    """TRL's `--save_strategy no` is `save_steps: null`: nothing saved during the run, the model at its end."""
    out = tmp_path / "run"
    result = run_tiny("sft", shards, out, model=tiny_model, max_steps=2, save_steps=None)
    assert result.global_step == 2
    assert not list(out.glob("checkpoint-*"))
    assert (out / "adapter_model.safetensors").is_file() and (out / "run.json").is_file()


def test_save_steps_null_is_refused_beside_what_reads_checkpoints(tmp_path):
    with pytest.raises(RufusError, match="save_steps null writes no checkpoint, but checkpoint_mirror reads them"):
        load_stage_config("sft", get_stage("sft").config_class, overrides={
            "save_steps": None, "checkpoint_mirror": str(tmp_path / "mirror"), "output_dir": str(tmp_path / "run")})
