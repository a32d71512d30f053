"""`rufus-train pipeline`: stages chain (each starts from the previous output, adapters merged)
and the quick-evaluation table has a row for the base and for each stage (wiring: run on the
built-in tiny-random)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import example_shards
import pytest
import yaml
from conftest import REPO
from train_helpers import one_torch_thread
from transformers import AutoModelForCausalLM
from typer.testing import CliRunner

from rufus_data.base.errors import RufusError
from rufus_data.benchmarks.suite import load_suite
from rufus_eval.request import apply_sampling_overrides
from rufus_train.cli import app
from rufus_train.pipeline import StageEval, load_pipeline, stage_configs, stage_request

pytestmark = pytest.mark.usefixtures("one_torch_thread")
TULU3_MINI_SYSTEM = "You are a careful math assistant. Reason step by step, then finish with 'The answer is N.'"
_ = one_torch_thread


def test_pipeline_chains_sft_then_dpo_and_prints_table(data_root, tiny_model, tmp_path):
    shards = tmp_path / "shards"
    example_shards.gsm8k_sft(data_root, shards / "sft", limit=8, max_chars=350)
    example_shards.gsm8k_preference(data_root, shards / "pref", start=100, limit=8, max_chars=350)
    tiny = {"max_steps": 1, "per_device_train_batch_size": 2, "max_length": 160, "gradient_checkpointing": False,
            "save_steps": 1, "logging_steps": 1}
    spec = {
        "name": "mini",
        "model": "tiny-random",
        "output_dir": str(tmp_path / "runs"),
        "eval": {"suite": "quick", "tasks": ["gsm8k"], "limit": 2, "repeats": 1, "max_tokens": 16},
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
    for tag, model in (("00-base", "tiny-random"), ("02-dpo", str(tmp_path / "runs" / "02-dpo"))):
        record = json.loads((tmp_path / "runs" / "eval" / tag / "results.json").read_text())
        assert record["suite"] == "quick" and list(record["tasks"]) == ["gsm8k"]
        assert record["tasks"]["gsm8k"]["docs"] == 2 and record["checkpoint"] == model
    dpo_adapter = json.loads((tmp_path / "runs" / "02-dpo" / "adapter_config.json").read_text())
    assert dpo_adapter["base_model_name_or_path"] == str(tmp_path / "runs" / "01-sft")  # dpo started from sft
    sft_adapter = json.loads((tmp_path / "runs" / "01-sft" / "adapter_config.json").read_text())
    assert sft_adapter["base_model_name_or_path"] == "tiny-random"  # the built-in's name, not its cache path
    # every row was scored greedily on the same items: the task config each run wrote says so
    for tag in ("00-base", "01-sft", "02-dpo"):
        config = yaml.safe_load((tmp_path / "runs" / "eval" / tag / "tasks" / "gsm8k.yaml").read_text())
        assert (config["repeats"], config["generation_kwargs"]["temperature"]) == (1, 0.0)
    assert not (tmp_path / "runs" / "eval" / "suite.yaml").exists()  # no edited copy of the suite: overrides
    # the pipeline ends with the merged model, tokenizer beside it, ready for inference (no adapter left)
    merged = tmp_path / "runs" / "merged"
    assert (merged / "config.json").exists() and (merged / "tokenizer_config.json").exists()
    assert not (merged / "adapter_config.json").exists()
    model = AutoModelForCausalLM.from_pretrained(merged)
    assert model.config.architectures == ["LlamaForCausalLM"]


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


def dry_run_stages(output: str) -> dict:
    """The stage configs, eval block and merge line of `pipeline --dry-run` output, parsed back."""
    parts = re.split(r"^# (?:stage \d+ of \d+: \S+ -> \S+|evaluation of .*|final model)$", output,
                     flags=re.MULTILINE)
    stages = [yaml.safe_load(part) for part in parts[1:-2]]
    return {"stages": {s["stage"]: s for s in stages}, "order": [s["stage"] for s in stages],
            "eval": yaml.safe_load(parts[-2])["eval"], "merge": yaml.safe_load(parts[-1])["merge"]}


def test_tulu3_mini_dry_run_shows_every_recipe_setting(tmp_path):
    """`pipeline --dry-run` prints each stage's resolved config as `stage --dry-run` does, loads
    nothing, and every Tulu 3 setting the pipeline claims is there."""
    result = CliRunner().invoke(app, ["pipeline", str(REPO / "catalogs/pipelines/tulu3_mini.yaml"), "--dry-run"])
    assert result.exit_code == 0, result.output
    printed = dry_run_stages(result.stdout)
    assert printed["order"] == ["sft", "dpo", "reasoning_rl"]
    sft, dpo, rl = (printed["stages"][name] for name in printed["order"])
    assert dpo["model"] == sft["output_dir"] and rl["model"] == dpo["output_dir"]  # each from the previous stage
    for config in (sft, dpo, rl):
        assert config["lora"] == {"enabled": True, "method": "lora", "r": 32, "alpha": 64, "dropout": 0.05,
                                  "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                                     "down_proj"]}
        assert config["trainer"] == {"optim": "adamw_torch", "lr_scheduler_type": "cosine", "warmup_steps": 0.05,
                                     "max_grad_norm": 1.0}
    assert (sft["assistant_only_loss"], sft["learning_rate"], sft["max_steps"], sft["max_length"]) == (True, 1e-4, 40, 640)
    assert (dpo["beta"], dpo["loss_type"], dpo["learning_rate"], dpo["max_steps"]) == (0.1, "sigmoid_norm", 1e-5, 24)
    recipe_rl = {"beta": 0.02, "kl_estimator": 2, "epsilon": 0.2, "epsilon_high": 0.272, "adv_norm": "centered",
                 "num_generations": 4, "per_device_train_batch_size": 8, "gradient_accumulation_steps": 2, "temperature": 1.0,
                 "max_completion_length": 256, "learning_rate": 2e-5, "max_steps": 6, "overlong_cache": None}
    assert {key: rl[key] for key in recipe_rl} == recipe_rl
    assert rl["rewards"] == [{"name": "string_match", "extractor": "last_number", "gold_extractor": "gsm8k",
                              "answer_column": "expected_output"}]  # the GSM8K verifier alone
    # every stage on its own GSM8K catalog; the eval under the same system prompt, greedy, 24 problems, 256 tokens
    assert [c["data"] for c in (sft, dpo, rl)] == [[f"catalogs/data/tulu3_mini_{s}.yaml"] for s in ("sft", "dpo", "rl")]
    assert {k: printed["eval"][k] for k in ("suite", "temperature", "repeats", "limit", "max_tokens")} == {
        "suite": "tulu3_mini", "temperature": 0.0, "repeats": 1, "limit": 24, "max_tokens": 256}
    assert load_suite("tulu3_mini").system_prompt == TULU3_MINI_SYSTEM
    assert printed["merge"] is True
    assert not (REPO / "runs" / "tulu3_mini").exists() or "pipeline valid" in result.output  # nothing trained


def test_shipped_pipeline_runs_as_typed_from_any_folder(tmp_path, monkeypatch):
    """`rufus-train pipeline catalogs/pipelines/tulu3_mini.yaml` outside the repository finds the
    shipped file (as `rufus-data mix catalogs/sft.yaml` does); a missing file is still an error."""
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, ["pipeline", "catalogs/pipelines/tulu3_mini.yaml", "--dry-run"])
    assert result.exit_code == 0, result.output
    assert dry_run_stages(result.stdout)["order"] == ["sft", "dpo", "reasoning_rl"]
    missing = CliRunner().invoke(app, ["pipeline", "catalogs/pipelines/nope.yaml", "--dry-run"])
    assert missing.exit_code != 0 and "catalogs/pipelines/nope.yaml does not exist" in missing.output
    assert "your catalogs" in missing.output and "shipped ones" in missing.output  # both places it looked


def test_pipeline_defaults_go_under_every_stage_and_the_stage_wins(tmp_path):
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump({
        "name": "p", "output_dir": str(tmp_path / "runs"),
        "defaults": {"learning_rate": 3e-5, "lora": {"r": 16, "alpha": 32}, "trainer": {"max_grad_norm": 0.5}},
        "stages": [{"stage": "sft", "trainer": {"lr_scheduler_type": "cosine"}},
                   {"stage": "dpo", "learning_rate": 1e-6, "lora": {"r": 8}}],
    }))
    sft, dpo = stage_configs(load_pipeline(path))
    assert sft.learning_rate == 3e-5 and sft.lora.r == 16 and sft.lora.alpha == 32
    assert sft.trainer == {"max_grad_norm": 0.5, "lr_scheduler_type": "cosine"}  # merged key by key
    assert dpo.learning_rate == 1e-6 and dpo.lora.r == 8 and dpo.lora.alpha == 32
    path.write_text(yaml.safe_dump({"name": "p", "defaults": {"model": "x"}, "stages": [{"stage": "sft"}]}))
    with pytest.raises(RufusError, match=r"defaults sets `model`, which the pipeline chains itself"):
        load_pipeline(path)


def test_greedy_evaluation_is_one_sample_per_item(tmp_path):
    request = stage_request("tiny-random", StageEval(suite="quick", tasks=["gsm8k"], limit=4), tmp_path, "00-base")
    assert (request.tasks, request.temperature, request.repeats) == (["gsm8k"], 0.0, 1)
    suite = load_suite(request.suite)
    apply_sampling_overrides(suite, request)  # as the run applies them: temperature is an override like repeats
    gsm8k = next(t for t in suite.tasks if t.name == "gsm8k")
    assert suite.sampling_for(gsm8k).temperature == 0.0 and suite.k(gsm8k) == 1
    with pytest.raises(ValueError, match=r"greedy decoding \(temperature 0\) gives 4 copies of one answer"):
        StageEval(repeats=4)


def test_an_eval_block_that_says_samples_reads_as_repeats_with_a_note(tmp_path, capsys):
    """A pipeline written before k was `repeats` still loads; the note says what to rename."""
    path = tmp_path / "old.yaml"
    path.write_text(yaml.safe_dump({"name": "old", "output_dir": str(tmp_path / "runs"),
                                    "eval": {"samples": 2, "temperature": 0.6}, "stages": [{"stage": "sft"}]}))
    assert load_pipeline(path).eval.repeats == 2
    assert "`samples` is now `repeats`" in " ".join(capsys.readouterr().err.split())
    path.write_text(yaml.safe_dump({"name": "old", "eval": {"samples": 2, "repeats": 2}, "stages": [{"stage": "sft"}]}))
    with pytest.raises(RufusError, match="`samples` is the old name of `repeats`: give only `repeats`"):
        load_pipeline(path)


@pytest.mark.slow
@pytest.mark.spawn
def test_tulu3_mini_pipeline_within_its_budget(tmp_path):
    """The bench run: the Tulu 3 mini recipe on its own data, the greedy stage table, the merged model (opt-in)."""
    env = {**os.environ, "RUFUS_DATA_ROOT": os.environ["RUFUS_DATA_ROOT"]}
    proc = subprocess.run(
        [sys.executable, "bench/tulu3_mini.py", "--work", str(tmp_path)], check=False, cwd=REPO, env=env,
        capture_output=True,
        text=True, timeout=75 * 60,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "within the 60 min budget" in proc.stdout
    rows = json.loads((tmp_path / "pipeline.json").read_text())
    assert [r["stage"] for r in rows] == ["base", "sft", "dpo", "rlvr"]
    assert [r["steps"] for r in rows[1:]] == [40, 24, 6]
    assert (tmp_path / "merged" / "config.json").exists() and (tmp_path / "merged" / "tokenizer_config.json").exists()


def test_one_adapter_pipeline_trains_the_sft_adapter_on_against_the_original(data_root, tiny_model, tmp_path):
    """`adapter: one` (the Tulu 3 mini notebook): the dpo stage loads the sft stage's adapter onto the
    original base and trains it further, so its reference (the adapter off) is the original model and
    the saved adapter applies to the original; the merged model is that base plus this one adapter."""
    from peft import PeftModel
    from safetensors.torch import load_file

    shards = tmp_path / "shards"
    example_shards.gsm8k_sft(data_root, shards / "sft", limit=8, max_chars=350)
    example_shards.gsm8k_preference(data_root, shards / "pref", start=100, limit=8, max_chars=350)
    tiny = {"max_steps": 1, "per_device_train_batch_size": 2, "max_length": 160, "gradient_checkpointing": False,
            "save_steps": 1, "logging_steps": 1, "learning_rate": 1e-2}
    spec = {"name": "one", "model": "tiny-random", "output_dir": str(tmp_path / "runs"), "adapter": "one",
            "defaults": {"lora": {"r": 4, "target_modules": ["q_proj", "v_proj"]}},
            "stages": [{"stage": "sft", "data": [str(shards / "sft")], **tiny},
                       {"stage": "dpo", "data": [str(shards / "pref")], **tiny}]}
    path = tmp_path / "one.yaml"
    path.write_text(yaml.safe_dump(spec))
    configs = stage_configs(load_pipeline(path))
    assert [c.lora.continue_adapter for c in configs] == [False, True]
    result = CliRunner().invoke(app, ["pipeline", str(path)])
    assert result.exit_code == 0, result.output
    runs = tmp_path / "runs"
    dpo_adapter = json.loads((runs / "02-dpo" / "adapter_config.json").read_text())
    assert dpo_adapter["base_model_name_or_path"] == "tiny-random"  # not the sft run: the adapter was trained on
    sft_weights = load_file(runs / "01-sft" / "adapter_model.safetensors")
    dpo_weights = load_file(runs / "02-dpo" / "adapter_model.safetensors")
    assert sft_weights.keys() == dpo_weights.keys()
    # lora_B starts at zero in a fresh adapter: dpo's differs from sft's by one small step, not by sft's whole update
    moved = [k for k in sft_weights if "lora_B" in k and not (sft_weights[k] == 0).all()]
    assert moved and all((dpo_weights[k] - sft_weights[k]).abs().max() < sft_weights[k].abs().max() for k in moved)
    merged = AutoModelForCausalLM.from_pretrained(runs / "merged")
    base = AutoModelForCausalLM.from_pretrained(str(tiny_model))
    expected = PeftModel.from_pretrained(base, runs / "02-dpo").merge_and_unload()
    for (name, got), want in zip(merged.state_dict().items(), expected.state_dict().values(), strict=True):
        assert (got.float() - want.to(got.dtype).float()).abs().max() < 1e-3, name  # saved in the base's bf16


def test_one_adapter_pipeline_refuses_full_fine_tuning(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump({"name": "bad", "adapter": "one", "stages": [
        {"stage": "sft"}, {"stage": "dpo", "lora": {"enabled": False}}]}))
    with pytest.raises(RufusError, match=r"continue_adapter trains the starting run's LoRA adapter further"):
        load_pipeline(path)
