"""Every stage of the first half runs two optimizer steps on CPU with the built-in SmolLM2-135M
and LoRA on small real shards, writes a checkpoint, and changes the adapter weights."""

from __future__ import annotations

import json

import pytest
import torch
from train_helpers import assert_adapter_trained, one_torch_thread, run_tiny, tiny_config

from rufus_train import examples, modeling
from rufus_train.runner import build_trl_args

pytestmark = pytest.mark.usefixtures("one_torch_thread")
_ = one_torch_thread  # the fixture is used through pytestmark


@pytest.fixture(scope="session")
def train_shards(tmp_path_factory, data_root):
    root = tmp_path_factory.mktemp("train_shards")
    return {
        "gsm8k_sft": examples.gsm8k_sft(data_root, root / "gsm8k_sft", limit=16, max_chars=350),
        "code_sft": examples.code_alpaca_sft(data_root, root / "code_sft", limit=16),
        "gsm8k_pref": examples.gsm8k_preference(data_root, root / "gsm8k_pref", limit=16, max_chars=350),
        "gsm8k_kto": examples.gsm8k_kto(data_root, root / "gsm8k_kto", limit=16, max_chars=350),
        "gsm8k_rl": examples.gsm8k_rl(data_root, root / "gsm8k_rl", limit=16, max_chars=350),
    }


def test_sft_trains_adapter_on_gsm8k_and_code_alpaca(train_shards, builtin_model, tmp_path):
    result = run_tiny("sft", [train_shards["gsm8k_sft"], train_shards["code_sft"]], tmp_path / "sft")
    assert_adapter_trained(result)
    out = result.output_dir
    for name in ("config.yaml", "train.log", "metrics.jsonl", "run.json", "adapter_model.safetensors"):
        assert (out / name).exists(), name
    run = json.loads((out / "run.json").read_text())
    assert run["global_step"] == 2 and run["lora"]["r"] == 4
    assert 0 < run["trainable_params"] < run["total_params"] / 100  # only the adapter trains
    # the base is recorded as a reference that loads anywhere (not the cache path), and named by the card
    assert json.loads((out / "adapter_config.json").read_text())["base_model_name_or_path"] == "smollm2-135m"
    assert run["base_model"] == "smollm2-135m" and run["dtype"] == "float32"
    card = (out / "README.md").read_text()
    assert "HuggingFaceTB/SmolLM2-135M-Instruct" in card and "[None]" not in card
    # how far the weights moved, and the warning a 2-step run earns
    assert run["weight_update"]["relative"] > 0 and "barely moved" in run["warning"]
    log = (out / "train.log").read_text()  # the libraries' logs, not only Rufus's
    assert "transformers.trainer: ***** Running training *****" in log and "rufus_train: step 2: " in log


def test_midtrain_packs_and_trains_every_token(train_shards, tmp_path):
    result = run_tiny("midtrain", train_shards["gsm8k_sft"], tmp_path / "mid", max_length=128)
    assert_adapter_trained(result)
    dataset = result.trainer.train_dataset
    assert "seq_lengths" in dataset.column_names  # packed rows (TRL BFD packing)
    assert all(label != -100 for row in dataset["labels"][:4] for label in row)  # every token carries loss


def test_dpo_trains_adapter(train_shards, tmp_path):
    result = run_tiny("dpo", train_shards["gsm8k_pref"], tmp_path / "dpo")
    assert_adapter_trained(result)
    assert result.trainer.args.loss_type == ["sigmoid"] and result.trainer.args.beta == 0.1
    assert result.trainer.args.learning_rate == pytest.approx(1e-5)  # 10x below SFT's LoRA rate
    first = result.metrics[0]
    assert first["logps/chosen"] != first["logps/rejected"]  # the pairs differ inside max_length


@pytest.mark.parametrize("loss_type", ["sigmoid_norm", "apo_zero"])
def test_dpo_loss_types_reach_trl(train_shards, tmp_path, loss_type):
    config = tiny_config("dpo", train_shards["gsm8k_pref"], tmp_path / "dpo", loss_type=loss_type)
    args = build_trl_args(config, tmp_path / "dpo")
    assert args.loss_type == [loss_type] and args.beta == 0.1


def test_kto_reads_its_own_label_column(train_shards, tmp_path):
    result = run_tiny("kto", train_shards["gsm8k_kto"], tmp_path / "kto")
    assert_adapter_trained(result)
    assert "label" in result.trainer.train_dataset.column_names


def test_orpo_trains_adapter(train_shards, tmp_path):
    result = run_tiny("orpo", train_shards["gsm8k_pref"], tmp_path / "orpo")
    assert_adapter_trained(result)


@pytest.fixture(scope="session")
def perturbed_teacher(tmp_path_factory, builtin_model):
    """A teacher that differs from the student: the built-in with seeded noise on every matrix."""
    teacher = modeling.load_model(builtin_model, "float32")
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for param in teacher.parameters():
            if param.dim() == 2:
                param.add_(torch.randn(param.shape, generator=generator) * param.std() * 0.3)
    folder = tmp_path_factory.mktemp("teacher") / "smollm2-perturbed"
    teacher.to(torch.bfloat16).save_pretrained(folder)
    return folder


def test_distill_trains_student_toward_teacher(train_shards, perturbed_teacher, tmp_path):
    result = run_tiny(
        "distill", train_shards["gsm8k_rl"], tmp_path / "distill", teacher=str(perturbed_teacher), max_completion_length=32
    )
    assert_adapter_trained(result)
    losses = [m["loss"] for m in result.metrics if "loss" in m]
    assert all(loss > 0 for loss in losses)  # a differing teacher gives a non-zero divergence
    assert result.trainer.args.beta == 1.0  # reverse KL by default
