"""`rufus-train pipeline`: stages chain (each starts from the previous output, adapters merged)
and the quick-evaluation table has a row for the base and for each stage."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import yaml
from conftest import REPO
from train_helpers import one_torch_thread
from typer.testing import CliRunner

from rufus_train import examples
from rufus_train.cli import app
from rufus_train.pipeline import load_pipeline

pytestmark = pytest.mark.usefixtures("one_torch_thread")
_ = one_torch_thread


def test_pipeline_chains_sft_then_dpo_and_prints_table(data_root, builtin_model, tmp_path):
    shards = tmp_path / "shards"
    examples.gsm8k_sft(data_root, shards / "sft", limit=8, max_chars=350)
    examples.gsm8k_preference(data_root, shards / "pref", start=100, limit=8, max_chars=350)
    tiny = {"max_steps": 1, "per_device_train_batch_size": 2, "max_length": 160, "gradient_checkpointing": False,
            "save_steps": 1, "logging_steps": 1}
    spec = {
        "name": "mini",
        "output_dir": str(tmp_path / "runs"),
        "eval": {"suite": "quick", "tasks": ["gsm8k"], "limit": 2, "samples": 1, "max_tokens": 16},
        "stages": [{"stage": "sft", "data": [str(shards / "sft")], **tiny},
                   {"stage": "dpo", "data": [str(shards / "pref")], **tiny}],
    }
    path = tmp_path / "mini.yaml"
    path.write_text(yaml.safe_dump(spec))
    result = CliRunner().invoke(app, ["pipeline", str(path)])
    assert result.exit_code == 0, result.output
    rows = json.loads((tmp_path / "runs" / "pipeline.json").read_text())
    assert [r["stage"] for r in rows] == ["base", "sft", "dpo"]
    assert all(0.0 <= r["gsm8k avg@1"] <= 1.0 for r in rows)
    for name in ("base", "sft", "dpo", "gsm8k avg@1"):
        assert name in result.output
    # each row is a rufus-eval run of the quick suite on that stage's model (adapters merged)
    for tag, model in (("00-base", "smollm2-135m"), ("02-dpo", str(tmp_path / "runs" / "02-dpo"))):
        record = json.loads((tmp_path / "runs" / "eval" / tag / "results.json").read_text())
        assert record["suite"] == "quick" and list(record["tasks"]) == ["gsm8k"]
        assert record["tasks"]["gsm8k"]["docs"] == 2 and record["checkpoint"] == model
    dpo_adapter = json.loads((tmp_path / "runs" / "02-dpo" / "adapter_config.json").read_text())
    assert dpo_adapter["base_model_name_or_path"] == str(tmp_path / "runs" / "01-sft")  # dpo started from sft
    sft_adapter = json.loads((tmp_path / "runs" / "01-sft" / "adapter_config.json").read_text())
    assert sft_adapter["base_model_name_or_path"] == "smollm2-135m"  # the built-in's name, not its cache path


def test_pipeline_refuses_unknown_eval_task_before_training(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump({"name": "bad", "eval": {"suite": "quick", "tasks": ["gsm8kk"]},
                                    "stages": [{"stage": "sft"}]}))
    with pytest.raises(Exception, match=r"eval.tasks \['gsm8kk'\] are not in suite quick: use some of gsm8k"):
        load_pipeline(path)


def test_pipeline_refuses_chained_keys(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump({"name": "bad", "stages": [{"stage": "sft", "model": "x"}]}))
    with pytest.raises(Exception, match=r"stages\[0\] sets `model`, which the pipeline chains itself"):
        load_pipeline(path)


@pytest.mark.slow
def test_tulu3_mini_pipeline_under_20_minutes(tmp_path):
    """The bench run: sft -> dpo -> reasoning_rl on GSM8K with the quick-eval table (opt-in)."""
    env = {**os.environ, "RUFUS_DATA_ROOT": os.environ["RUFUS_DATA_ROOT"]}
    proc = subprocess.run(
        [sys.executable, "bench/tulu3_mini.py", "--work", str(tmp_path)], check=False, cwd=REPO, env=env,
        capture_output=True,
        text=True, timeout=30 * 60,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "within the 20 min budget" in proc.stdout
    rows = json.loads((tmp_path / "runs" / "pipeline.json").read_text())
    assert [r["stage"] for r in rows] == ["base", "sft", "dpo", "reasoning_rl"]
