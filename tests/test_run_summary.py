"""How a stage ends: its summary table and train_curves.png from metrics.jsonl, and the tracker
naming (project `rufus`, a run name from stage and folder, a pipeline's stages grouped). A tiny
SFT run on tiny-random: mechanics."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import example_shards
import pytest
from PIL import Image
from train_helpers import one_torch_thread, run_tiny, tiny_config

from rufus_data.folders.run_folder import TRAIN_CURVES
from rufus_train.run_summary import run_name
from rufus_train.trl_args import build_trl_args

pytestmark = pytest.mark.usefixtures("one_torch_thread")
_ = one_torch_thread


@pytest.mark.train
def test_stage_ends_with_a_summary_table_and_curves(data_root, tiny_model, tmp_path, capsys):
    shards = example_shards.gsm8k_sft(data_root, tmp_path / "gsm8k_sft", limit=8, max_chars=350)
    result = run_tiny("sft", shards, tmp_path / "sft", model="tiny-random")
    captured = capsys.readouterr()
    shown = captured.out
    print(shown)
    for step in (1, 2):  # each step's progress line on the console (stderr), as it ends
        assert re.search(rf"step {step}/2: loss \d\S*, \d\S* s/step, ETA \d+:\d\d:\d\d$", captured.err, re.MULTILINE), captured.err
    run = json.loads((result.output_dir / "run.json").read_text())
    last = [m for m in result.metrics if "loss" in m][-1]
    assert "steps" in shown and "final loss" in shown and "tokens seen" in shown and "||dW||/||W||" in shown
    row = next(line for line in shown.splitlines() if line.startswith("│") and f"{last['loss']:.4g}" in line)
    assert f"{int(last['num_tokens']):,}" in row and f"{run['weight_update']['relative']:.3g}" in row
    assert row.split("│")[1].strip() == "2"  # steps
    curves = result.output_dir / TRAIN_CURVES
    assert curves.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and Image.open(curves).size == (1260, 320)
    assert f"curves: {curves}" in shown.replace("\n", "")
    args = result.trainer.args
    assert (args.project, args.run_name) == ("rufus", "sft")


@pytest.mark.train
def test_a_run_shorter_than_logging_steps_logs_every_step(data_root, tiny_model, tmp_path):
    """--max_steps 2 with logging_steps 10 (the shipped stages' value): each step still has its
    metrics line, and the run its curves."""
    shards = example_shards.gsm8k_sft(data_root, tmp_path / "gsm8k_sft", limit=8, max_chars=350)
    result = run_tiny("sft", shards, tmp_path / "sft", model="tiny-random", logging_steps=10)
    lines = [json.loads(line) for line in (result.output_dir / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in lines if "loss" in m] == [1, 2]
    assert (result.output_dir / TRAIN_CURVES).is_file()
    assert "logging every step: the run has 2 steps, fewer than logging_steps 10" in \
        (result.output_dir / "train.log").read_text()


def test_tracker_naming_follows_stage_folder_and_pipeline(tmp_path, monkeypatch):
    monkeypatch.delenv("WANDB_PROJECT", raising=False)
    monkeypatch.delenv("WANDB_RUN_GROUP", raising=False)
    monkeypatch.delenv("TRACKIO_PROJECT", raising=False)
    assert run_name("sft", Path("runs/sft")) == "sft"
    assert run_name("sft", Path("runs/sft-lr3")) == "sft-lr3"
    assert run_name("dpo", Path("runs/mine")) == "dpo-mine"
    args = build_trl_args(tiny_config("sft", tmp_path, tmp_path / "smol" / "02-dpo"), tmp_path / "smol" / "02-dpo")
    assert (args.project, args.run_name) == ("rufus", "smol/02-dpo")
    assert os.environ["WANDB_PROJECT"] == "rufus" and os.environ["WANDB_RUN_GROUP"] == "smol"
    monkeypatch.setenv("TRACKIO_PROJECT", "mine")
    config = tiny_config("sft", tmp_path, tmp_path / "x", trainer={"run_name": "given"})
    args = build_trl_args(config, tmp_path / "x")
    assert (args.project, args.run_name) == ("mine", "given")  # the user's settings win
