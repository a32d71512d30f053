"""`rufus-train pipeline`: stages chain (each starts from the previous output, adapters merged)
and the quick-evaluation table has a row for the base and for each stage (wiring: run on the
built-in tiny-random)."""

from __future__ import annotations

import ast
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


@pytest.mark.train
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


# The Tulu 3 mini notebook's CFG (shared/seeds/003_d17be3c0c87e36f6.txt, lines 79-109), its LoRA
# (line 198: r=32, lora_alpha=64, lora_dropout=0.05), warmup (line 214: int(0.05 * steps) + 1) and
# evaluation budget (line 222: max_new=256). test_the_table_is_the_seeds_cfg reads it back from the seed.
NOTEBOOK_CFG = {
    "max_seq_len": 640, "seed": 42, "n_sft": 192, "sft_steps": 40, "sft_micro_bs": 2, "sft_accum": 4, "sft_lr": 1e-4,
    "n_dpo": 96, "dpo_steps": 24, "dpo_micro_bs": 1, "dpo_accum": 4, "dpo_lr": 5e-5, "dpo_beta": 0.1, "dpo_norm": True,
    "grpo_iters": 6, "prompts_per_iter": 4, "samples_per_prompt": 4, "grpo_micro_bs": 1, "grpo_inner_epochs": 2,
    "grpo_lr": 2e-5, "grpo_temperature": 1.0, "grpo_max_new": 200, "grpo_kl_beta": 0.02, "clip_lower": 0.2,
    "clip_higher": 0.272, "kl_estimator": 2, "adv_norm": "centered", "n_eval": 24,
}
OPEN_INSTRUCT_KL = ["k1", "k2", "k3", "ratio x k1"]  # open_instruct model_utils.estimate_kl, indexed by kl_estimator
SEED = REPO.parent / "shared" / "seeds" / "003_d17be3c0c87e36f6.txt"


def seed_cfg(text: str) -> dict:
    """The `name: type = value` lines of the seed's `class CFG` (the model's name left out)."""
    body = text[text.index("class CFG:"):text.index("cfg = CFG()")]
    pairs = re.findall(r"^(\w+): \w+ = (.+)$", body, flags=re.MULTILINE)
    return {name: ast.literal_eval(value.strip()) for name, value in pairs if name != "model"}


@pytest.mark.skipif(not SEED.exists(), reason="the seed documents are not beside this checkout")
def test_the_table_is_the_seeds_cfg():
    text = SEED.read_text()
    assert seed_cfg(text) == NOTEBOOK_CFG
    assert "r=32, lora_alpha=64, lora_dropout=0.05" in text and "int(0.05 * steps) + 1" in text
    assert "def evaluate(tag, rows, max_new=256)" in text


def notebook_warmup(steps: int) -> int:
    return int(0.05 * steps) + 1


def test_tulu3_mini_dry_run_shows_every_recipe_setting(tmp_path):
    """`pipeline --dry-run` prints each stage's resolved config as `stage --dry-run` does, loads
    nothing, and every number of the notebook's CFG is there, read back from the printout."""
    cfg = NOTEBOOK_CFG
    result = CliRunner().invoke(app, ["pipeline", str(REPO / "catalogs/pipelines/tulu3_mini.yaml"), "--dry-run"])
    assert result.exit_code == 0, result.output
    printed = dry_run_stages(result.stdout)
    assert printed["order"] == ["sft", "dpo", "reasoning_rl"]
    sft, dpo, rl = (printed["stages"][name] for name in printed["order"])
    assert dpo["model"] == sft["output_dir"] and rl["model"] == dpo["output_dir"]  # each from the previous stage
    lora = {"enabled": True, "method": "lora", "r": 32, "alpha": 64, "dropout": 0.05,
            "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]}
    for config, continued in ((sft, False), (dpo, True), (rl, True)):  # one adapter through every stage
        assert config["lora"] == {**lora, "continue_adapter": continued}
        assert config["seed"] == cfg["seed"]
        assert {k: config["trainer"][k] for k in ("optim", "lr_scheduler_type", "max_grad_norm")} == {
            "optim": "adamw_torch", "lr_scheduler_type": "cosine", "max_grad_norm": 1.0}
        assert config["trainer"]["warmup_steps"] == notebook_warmup(config["max_steps"])
    assert sft["assistant_only_loss"] is True
    assert (sft["learning_rate"], sft["max_steps"], sft["max_length"], sft["per_device_train_batch_size"],
            sft["gradient_accumulation_steps"]) == (cfg["sft_lr"], cfg["sft_steps"], cfg["max_seq_len"],
                                                    cfg["sft_micro_bs"], cfg["sft_accum"])
    assert (dpo["beta"], dpo["loss_type"], dpo["learning_rate"], dpo["max_steps"], dpo["max_length"],
            dpo["per_device_train_batch_size"], dpo["gradient_accumulation_steps"]) == (
        cfg["dpo_beta"], "sigmoid_norm" if cfg["dpo_norm"] else "sigmoid", cfg["dpo_lr"], cfg["dpo_steps"],
        cfg["max_seq_len"], cfg["dpo_micro_bs"], cfg["dpo_accum"])
    rollouts = cfg["prompts_per_iter"] * cfg["samples_per_prompt"]
    assert {key: rl[key] for key in ("beta", "kl_estimator", "epsilon", "epsilon_high", "adv_norm", "num_generations",
                                     "per_device_train_batch_size", "gradient_accumulation_steps", "temperature",
                                     "max_completion_length", "learning_rate", "max_steps", "num_iterations")} == {
        "beta": cfg["grpo_kl_beta"], "kl_estimator": OPEN_INSTRUCT_KL[cfg["kl_estimator"]],
        "epsilon": cfg["clip_lower"], "epsilon_high": cfg["clip_higher"], "adv_norm": cfg["adv_norm"],
        "num_generations": cfg["samples_per_prompt"], "per_device_train_batch_size": cfg["grpo_micro_bs"],
        "gradient_accumulation_steps": rollouts // cfg["grpo_micro_bs"], "temperature": cfg["grpo_temperature"],
        "max_completion_length": cfg["grpo_max_new"], "learning_rate": cfg["grpo_lr"],
        "max_steps": cfg["grpo_iters"] * cfg["grpo_inner_epochs"], "num_iterations": cfg["grpo_inner_epochs"]}
    assert rl["trainer"]["loss_type"] == "grpo"  # masked_mean per sequence (micro-batch 1), averaged over sequences
    assert rl["stop_after_dead_steps"] == 0  # the notebook trains every rollout batch, dead or not
    assert rl["overlong_cache"] is None
    assert rl["rewards"] == [{"name": "string_match", "extractor": "last_number", "gold_extractor": "gsm8k",
                              "answer_column": "expected_output"}]  # the GSM8K verifier alone
    # every stage on its own GSM8K catalog, cut as the notebook cuts train_rows
    assert [c["data"] for c in (sft, dpo, rl)] == [[f"catalogs/data/tulu3_mini_{s}.yaml"] for s in ("sft", "dpo", "rl")]
    cuts = {s: yaml.safe_load((REPO / f"catalogs/data/tulu3_mini_{s}.yaml").read_text())["sources"][0]["rows"]
            for s in ("sft", "dpo", "rl")}
    assert cuts == {"sft": [0, cfg["n_sft"] - 1], "dpo": [cfg["n_sft"], cfg["n_sft"] + cfg["n_dpo"] - 1],
                    "rl": [0, cfg["n_sft"] - 1]}
    assert {k: printed["eval"][k] for k in ("suite", "temperature", "repeats", "limit", "max_tokens")} == {
        "suite": "tulu3_mini", "temperature": 0.0, "repeats": 1, "limit": cfg["n_eval"], "max_tokens": 256}
    assert load_suite("tulu3_mini").system_prompt == TULU3_MINI_SYSTEM
    assert printed["merge"] is True
    # the recipe's DPO rate is 2x below SFT's: the playbook's warning says it, and that the recipe sets it
    assert "This pipeline ships 5e-05 because its recipe sets it" in " ".join(result.output.split())
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
    assert [r["steps"] for r in rows[1:]] == [40, 24, 12]  # RLVR: 6 rollout batches x 2 inner epochs
    assert (tmp_path / "merged" / "config.json").exists() and (tmp_path / "merged" / "tokenizer_config.json").exists()


@pytest.mark.train
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
    # dpo's reference is the original model (the adapter off), not a copy of sft's adapter: the policy
    # (sft's adapter on) already differs from it at the first step, before any dpo update
    first = json.loads((runs / "02-dpo" / "metrics.jsonl").read_text().splitlines()[0])
    assert abs(first["rewards/chosen"]) > 0 or abs(first["rewards/rejected"]) > 0
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
