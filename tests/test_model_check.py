"""The models users bring (#43): `rufus-data models check` and the same table in `--dry_run`; a
tokenizer longer than the model's embeddings resized before training; a folder shaped like
Qwen2.5-0.5B-Instruct (tests/qwen_shaped.py) through the tulu3_mini pipeline."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rufus_data.models.check import check_model, dry_run_check

REPO = Path(__file__).resolve().parents[1]
WIDE = {"COLUMNS": "300"}


@pytest.fixture(scope="module")
def qwen_folder(tiny_model, tmp_path_factory) -> str:
    from qwen_shaped import write_qwen2_5_shaped

    return str(write_qwen2_5_shaped(tiny_model, tmp_path_factory.mktemp("qwen") / "Qwen2.5-0.5B-Instruct-tiny"))


@pytest.fixture(scope="module")
def grown_folder(tiny_model, tmp_path_factory) -> str:
    """The Qwen-shaped folder whose added tokens have no embedding rows."""
    from qwen_shaped import write_qwen2_5_shaped

    return str(write_qwen2_5_shaped(tiny_model, tmp_path_factory.mktemp("grown") / "grown", rows_for_added=False))


@pytest.fixture(scope="module")
def chats(tmp_path_factory, data_root):
    import example_shards

    return example_shards.gsm8k_sft(data_root, tmp_path_factory.mktemp("check_shards"), limit=4, max_chars=300)


def test_models_check_reads_a_qwen_shaped_folder(qwen_folder):
    """Template source, route, Qwen's two end tokens by name, no thinking switch, and the rows
    Qwen pads past its tokenizer; as JSON for scripts."""
    from rufus_data.cli import app

    result = CliRunner().invoke(app, ["models", "check", qwen_folder, "--format", "json"], env=WIDE)
    assert result.exit_code == 0, result.output
    found = {row["check"]: row["finding"] for row in json.loads(result.stdout)}
    assert found["chat template"] == "the model's own (qwen2_5)"
    assert found["loss mask route"].startswith("trl_training_template: ")
    assert found["end tokens"] == "<|im_end|> (2), <|endoftext|> (0) from generation_config.json"
    assert found["thinking switch"] == "none"
    assert found["vocabulary"] == "49171 tokens, 49216 embedding rows (45 spare)"


def test_models_check_says_each_template_source_and_switch(tiny_model, tmp_path):
    """A built-in by name with its own template; a `chat_template:` setting in its place (Qwen3's
    enable_thinking, Llama 3.1 by prefixes); a base model without one: none, and the route refused."""
    rows = dict(check_model("tiny-random"))
    assert rows["model"] == "built-in tiny-random" and rows["chat template"] == "the model's own (rufus_chatml)"
    assert rows["loss mask route"].startswith("markers: ") and rows["end tokens"].startswith("<|im_end|> (2)")
    qwen3 = dict(check_model("tiny-random", "qwen3"))
    assert qwen3["chat template"] == "`chat_template: qwen3` (qwen3)"
    assert qwen3["thinking switch"] == "enable_thinking (Qwen3-style: a template variable)"
    assert dict(check_model(tiny_model, "llama3_1"))["loss mask route"].startswith("prefixes: ")
    smol3 = tmp_path / "smollm3_style.jinja"
    smol3.write_text("{% if '/no_think' in messages[0]['content'] %}{% endif %}"
                     "{% for m in messages %}{{ m['content'] }}{% endfor %}")
    assert dict(check_model(tiny_model, str(smol3)))["thinking switch"] == "/think and /no_think system flags (SmolLM3-style)"
    base = tmp_path / "base"
    shutil.copytree(tiny_model, base, ignore=shutil.ignore_patterns("*chat_template*", "rufus-model.json"))
    bare = dict(check_model(str(base)))
    assert bare["chat template"].startswith("none: a base model; set `chat_template:`")
    assert bare["loss mask route"].startswith("refused: no chat template")
    assert bare["thinking switch"] == "none (no chat template)"


def test_models_check_refuses_what_cannot_load(tmp_path):
    from rufus_data.cli import app

    result = CliRunner().invoke(app, ["models", "check", str(tmp_path / "missing")])
    assert result.exit_code == 2 and "does not exist" in result.output
    assert dry_run_check(str(tmp_path / "runs" / "01-sft"), None) is None  # a pipeline's later stage: not yet there


def test_stage_dry_run_prints_the_check_table(qwen_folder, chats):
    """`rufus-train stage sft --dry_run` keeps the YAML on stdout and puts the table on stderr."""
    import yaml

    from rufus_train.cli import app

    result = CliRunner().invoke(app, ["stage", "sft", "--model", qwen_folder, "--data", str(chats), "--dry-run"],
                                env=WIDE)
    assert result.exit_code == 0, result.output
    assert yaml.safe_load(result.stdout)["model"] == qwen_folder
    assert "model check: " in result.stderr and "trl_training_template" in result.stderr
    assert "<|im_end|> (2), <|endoftext|> (0)" in result.stderr


@pytest.mark.train
def test_added_tokens_get_rows_before_training_and_an_adapter_loads_on_them(grown_folder, chats, tmp_path, capsys):
    """19 added tokens without rows: training resizes to 49,171 rows at the mean of the old ones
    (with a note), a LoRA run trains a step, and loading the run (base resized again, the same
    rows) and its merged copy give those rows back."""
    import torch
    from train_helpers import run_tiny
    from transformers import AutoModelForCausalLM

    from rufus_data.models.merged_model import merged_model
    from rufus_data.models.reference import ModelRef
    from rufus_train.modeling import load_model

    result = run_tiny("sft", chats, tmp_path / "run", model=grown_folder, max_steps=1, save_steps=1, max_rows=4)
    assert result.global_step == 1
    assert "19 more tokens than the model's 49152 embedding rows" in capsys.readouterr().err
    trained = result.trainer.model.get_input_embeddings().weight.detach()
    assert trained.shape[0] == 49171
    assert torch.allclose(trained[49152:], trained[:49152].mean(dim=0).expand(19, -1))
    loaded = load_model(str(result.output_dir)).get_input_embeddings().weight
    assert torch.equal(loaded[49152:], trained[49152:])
    merged = AutoModelForCausalLM.from_pretrained(merged_model(ModelRef.of(str(result.output_dir))))
    assert torch.equal(merged.get_input_embeddings().weight[49152:], trained[49152:])
    run = dict(check_model(str(result.output_dir)))  # a run folder: its tokenizer, its base's config
    assert run["model"] == f"run {result.output_dir} (LoRA on {Path(grown_folder).resolve()})"
    assert run["vocabulary"].startswith("49171 tokens, 49152 embedding rows: 19 tokens without a row")
    assert run["chat template"] == "the model's own (qwen2_5)"


def test_a_tokenizer_within_the_rows_changes_nothing(tiny_model):
    from transformers import AutoModelForCausalLM

    from rufus_data.models.embeddings import fit_embeddings

    model = AutoModelForCausalLM.from_pretrained(tiny_model)
    assert fit_embeddings(model, 49152) is None and fit_embeddings(model, 100) is None
    assert model.get_input_embeddings().weight.shape[0] == 49152


@pytest.mark.train
def test_tulu3_mini_dry_runs_and_trains_a_first_step_on_a_qwen_shaped_folder(qwen_folder, tmp_path, monkeypatch):
    """The shipped pipeline with `--model` a Qwen2.5-shaped folder: the dry run passes (its table
    names qwen2_5 and TRL's training template), and its first stage trains one step on it."""
    from rufus_data.folders.run_folder import read_run_json
    from rufus_train.cli import app
    from rufus_train.pipeline import load_pipeline, stage_configs
    from rufus_train.runner import run_stage

    monkeypatch.chdir(tmp_path)
    pipeline_file = "catalogs/pipelines/tulu3_mini.yaml"
    result = CliRunner().invoke(app, ["pipeline", pipeline_file, "--dry-run", "--model", qwen_folder], env=WIDE)
    assert result.exit_code == 0, result.output
    assert f"model: {qwen_folder}" in result.stdout and "the model's own (qwen2_5)" in result.stderr
    pipeline = load_pipeline(pipeline_file, model=qwen_folder)
    pipeline.stages[0].update(max_steps=1, save_steps=1, max_rows=4, per_device_train_batch_size=2,
                              gradient_accumulation_steps=1, max_length=256)
    first = stage_configs(pipeline, notes=[])[0]
    run = run_stage(first)
    assert run.global_step == 1
    summary = read_run_json(run.output_dir)
    assert summary["base_model"] == str(Path(qwen_folder).resolve())
    assert summary["chat_template"]["name"] == "qwen2_5" and summary["loss_mask"]["route"] == "trl_training_template"
