"""--show-mask shows exactly what TRL trains, and `export` gives a plain model whose
logits equal base + adapter: mechanics, on the built-in tiny-random (smollm2-135m's tokenizer
and template, random weights)."""

from __future__ import annotations

import json
import shutil

import example_shards
import pytest
import torch
from safetensors.torch import load_file, save_file
from typer.testing import CliRunner

from rufus_data.base.errors import RufusError
from rufus_train import modeling
from rufus_train.cli import app
from rufus_train.config import LoraSettings
from rufus_train.mask import LOSS_STYLE, loss_mask, render
from rufus_train.stage_base import conversational


@pytest.fixture(scope="module")
def sft_shards(tmp_path_factory, data_root):
    root = tmp_path_factory.mktemp("mask_shards")
    return {
        "gsm8k": example_shards.gsm8k_sft(data_root, root / "gsm8k", limit=6),
        "code": example_shards.code_alpaca_sft(data_root, root / "code", limit=6),
    }


def test_highlighted_tokens_are_the_assistant_reply(sft_shards, tiny_tokenizer):
    from rufus_data.folders.shards import read_shards

    messages = conversational(read_shards(sft_shards["gsm8k"]), "messages")[0]
    example = loss_mask(tiny_tokenizer, messages, assistant_only=True, max_length=None)
    text = render(tiny_tokenizer, example)
    highlighted = "".join(text.plain[s.start : s.end] for s in text.spans if s.style == LOSS_STYLE)
    assert highlighted == messages[-1]["content"] + "<|im_end|>"  # the reply and its end-of-turn token
    assert 0 < example.trained_tokens < len(example.input_ids)
    everything = loss_mask(tiny_tokenizer, messages, assistant_only=False, max_length=None)
    assert everything.trained_tokens == len(everything.input_ids)


def test_trainable_tokens_equal_trl_assistant_masks(sft_shards, tiny_model, tiny_tokenizer, tmp_path):
    """The mask --show-mask prints is the one TRL's SFTTrainer builds (labels != -100)."""
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    from rufus_data.folders.shards import read_shards

    conversations = conversational(read_shards(sft_shards["gsm8k"]), "messages") + conversational(
        read_shards(sft_shards["code"]), "messages"
    )
    args = SFTConfig(output_dir=str(tmp_path), assistant_only_loss=True, max_length=128, report_to="none", bf16=False)
    trainer = SFTTrainer(
        model=modeling.load_model(tiny_model, "float32"),
        args=args,
        train_dataset=Dataset.from_dict({"messages": conversations}),
        processing_class=tiny_tokenizer,
    )
    trl_rows = trainer.train_dataset
    assert len(trl_rows) == len(conversations)
    for conversation, ids, labels in zip(conversations, trl_rows["input_ids"], trl_rows["labels"], strict=True):
        mine = loss_mask(tiny_tokenizer, conversation, assistant_only=True, max_length=128)
        assert mine.input_ids == ids
        assert mine.loss_mask == [int(label != -100) for label in labels]


def test_show_mask_cli_prints_examples(sft_shards):
    result = CliRunner().invoke(app, ["stage", "sft", "--show-mask", "2", "--data", str(sft_shards["gsm8k"])])
    assert result.exit_code == 0, result.output
    assert "example 0:" in result.output and "example 1:" in result.output and "example 2:" not in result.output
    assert "tokens carry loss" in result.output
    assert "assistant turns only" in result.output
    result = CliRunner().invoke(app, ["stage", "dpo", "--show-mask", "1", "--data", str(sft_shards["gsm8k"])])
    assert result.exit_code == 2 and "applies to the sft and midtrain stages" in result.output


@pytest.fixture(scope="module")
def adapter_run(tmp_path_factory, tiny_model):
    """A run folder holding a LoRA adapter with non-zero weights (as training leaves it)."""
    peft_model = modeling.apply_lora(modeling.load_model(tiny_model, "float32"), LoraSettings())
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, param in peft_model.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.05)
    run = tmp_path_factory.mktemp("export") / "run"
    peft_model.peft_config["default"].base_model_name_or_path = tiny_model
    peft_model.save_pretrained(run)
    modeling.load_tokenizer(tiny_model).save_pretrained(run)
    return run, peft_model


def test_export_merge_logits_equal_base_plus_adapter(adapter_run, tiny_tokenizer, tmp_path):
    from transformers import AutoModelForCausalLM

    run, peft_model = adapter_run
    result = CliRunner().invoke(app, ["export", str(run), "--merge", "--out", str(tmp_path / "merged")])
    assert result.exit_code == 0, result.output
    said = " ".join(result.output.split())
    assert "lives in the adapter" in said and "does NOT include it" in said
    merged_dir = tmp_path / "merged"
    assert not (merged_dir / "adapter_config.json").exists() and (merged_dir / "config.json").exists()
    merged = AutoModelForCausalLM.from_pretrained(merged_dir, dtype=torch.float32).eval()
    base = modeling.load_model(json.loads((run / "adapter_config.json").read_text())["base_model_name_or_path"], "float32")
    ids = tiny_tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is 12 * 3?"}], add_generation_prompt=True, return_tensors="pt", return_dict=True
    )["input_ids"]
    with torch.no_grad():
        expected = peft_model.eval()(input_ids=ids).logits
        got = merged(input_ids=ids).logits
        plain = base.eval()(input_ids=ids).logits
    assert torch.allclose(got, expected, atol=1e-3), (got - expected).abs().max()
    assert (plain - expected).abs().max() > 1e-2  # the base alone does not carry the adapter's behaviour


def test_export_needs_an_adapter_folder(tmp_path, tiny_model):
    with pytest.raises(RufusError, match="holds no LoRA adapter"):
        modeling.export_merged(tiny_model, tmp_path / "out")
    result = CliRunner().invoke(app, ["export", str(tmp_path), "--out", str(tmp_path / "x")])
    assert result.exit_code == 2 and "holds no LoRA adapter" in result.output and not (tmp_path / "x").exists()


def test_one_merged_copy_per_run_shared_by_export_and_eval(adapter_run, tmp_path):
    """RUN/merged is made once: export and rufus-eval's plain_folder reuse it; a new adapter in
    the run gets a fresh copy; --out refuses an existing folder without --overwrite; the message
    says the base model itself was not changed."""
    from rufus_data.models.merged_model import plain_folder
    from rufus_data.models.reference import ModelRef

    run = tmp_path / "run"
    shutil.copytree(adapter_run[0], run, ignore=shutil.ignore_patterns("merged"))  # the copy an earlier test made
    first = CliRunner().invoke(app, ["export", str(run)])  # exporting is merging: no --merge needed
    assert first.exit_code == 0, first.output
    merged = run / "merged"
    said = " ".join(first.output.split())
    assert "merging the LoRA adapter" in said and "a copy of its base" in said and "the base model itself is unchanged" in said
    stamp = (merged / "model.safetensors").stat().st_mtime_ns
    again = CliRunner().invoke(app, ["export", str(run), "--merge"])  # as older scripts pass it
    assert again.exit_code == 0 and "merging" not in again.output  # reused, not merged again
    assert "--merge is no longer needed: export always merges" in " ".join(again.output.split())
    assert plain_folder(ModelRef.of(run)) == str(merged) and (merged / "model.safetensors").stat().st_mtime_ns == stamp
    assert not list(tmp_path.glob("run-merged*"))  # no second copy beside the run

    out = tmp_path / "elsewhere"
    assert CliRunner().invoke(app, ["export", str(run), "--merge", "--out", str(out)]).exit_code == 0
    refused = CliRunner().invoke(app, ["export", str(run), "--merge", "--out", str(out)])
    assert refused.exit_code == 2 and "already exists: pass --overwrite" in refused.output
    replaced = CliRunner().invoke(app, ["export", str(run), "--merge", "--out", str(out), "--overwrite"])
    assert replaced.exit_code == 0, replaced.output

    weights = load_file(run / "adapter_model.safetensors")  # the run trained further: a new adapter
    save_file({k: v * 2 for k, v in weights.items()}, run / "adapter_model.safetensors")
    assert plain_folder(ModelRef.of(run)) == str(merged)
    assert (merged / "model.safetensors").stat().st_mtime_ns != stamp
