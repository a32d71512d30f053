"""What a run folder records about its base model and its training: a base reference that loads
anywhere, a model card that names the base, and how far the weights moved (with a warning when
they barely did). No training here: the adapters are set by hand."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from rufus_data.models.reference import ModelRef
from rufus_train import modeling, weight_update
from rufus_train.config import LoraSettings
from rufus_train.model_card import model_card

SUMMARY = {"stage": "sft", "data": ["catalogs/data/sft_mixture.yaml"], "global_step": 2, "trainable_params": 460800,
           "total_params": 134975808, "final_metrics": {"train_loss": 1.25}, "seconds": 11.0,
           "lora": {"r": 4, "alpha": 8}, "versions": {"trl": "1.16.0"}}


def test_the_recorded_reference_is_loadable_anywhere(builtin_model, tmp_path, monkeypatch):
    assert ModelRef.of("smollm2-135m").portable == "smollm2-135m"
    assert ModelRef.of(builtin_model).portable == "smollm2-135m"  # the cache folder of a built-in is its name
    assert ModelRef.of("HuggingFaceTB/SmolLM2-135M-Instruct").portable == "HuggingFaceTB/SmolLM2-135M-Instruct"
    (tmp_path / "runs" / "sft").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    assert ModelRef.of("runs/sft").portable == str(tmp_path / "runs" / "sft")  # not relative to where it ran


def test_model_card_names_the_base_model(tmp_path):
    card = model_card(tmp_path / "sft", {**SUMMARY, "base_model": "smollm2-135m"})
    assert "base_model: HuggingFaceTB/SmolLM2-135M-Instruct" in card
    assert "[HuggingFaceTB/SmolLM2-135M-Instruct](https://huggingface.co/HuggingFaceTB/SmolLM2-135M-Instruct)" in card
    assert "`smollm2-135m`" in card and "None" not in card
    assert f"rufus-train export {tmp_path / 'sft'}    #" in card and "final training loss: 1.25" in card
    assert "--merge" not in card  # retired: exporting is merging
    hub = model_card(tmp_path / "x", {**SUMMARY, "base_model": "org/base", "lora": None})
    assert "base_model: org/base" in hub and "[org/base](https://huggingface.co/org/base)" in hub
    assert "library_name: transformers" in hub and "export" not in hub  # full fine-tuning: no adapter to merge
    earlier = tmp_path / "01-sft"
    earlier.mkdir()
    (earlier / "run.json").write_text(json.dumps({"base_model": "smollm2-135m"}))
    chained = model_card(tmp_path / "02-dpo", {**SUMMARY, "stage": "dpo", "base_model": str(earlier)})
    assert "base_model: HuggingFaceTB/SmolLM2-135M-Instruct" in chained and f"the Rufus run `{earlier}`" in chained
    folder = model_card(tmp_path / "y", {**SUMMARY, "base_model": str(tmp_path)})
    assert "base_model:" not in folder and f"the model folder `{tmp_path}`" in folder


@pytest.fixture(scope="module")
def lora_model(builtin_model):
    return modeling.apply_lora(modeling.load_model(builtin_model, "float32"), LoraSettings())


def set_lora_b(model, value: float) -> None:
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.fill_(value)


def expected_relative(model) -> float:
    """||dW|| / ||W|| computed by hand from the adapter tensors (scale x B @ A)."""
    delta_sq = base_sq = 0.0
    with torch.no_grad():
        for module in model.modules():
            if hasattr(module, "lora_A") and "default" in module.lora_A:
                a, b = module.lora_A["default"].weight, module.lora_B["default"].weight
                delta_sq += float(((b @ a) * module.scaling["default"]).pow(2).sum())
                base_sq += float(module.base_layer.weight.pow(2).sum())
    return (delta_sq / base_sq) ** 0.5


def test_lora_update_is_measured_and_a_barely_moved_run_is_told(lora_model):
    set_lora_b(lora_model, 0.0)
    assert weight_update.measure(lora_model, lora=True) == {"relative": 0.0, "max_abs": 0.0}
    set_lora_b(lora_model, 1e-4)
    tiny = weight_update.measure(lora_model, lora=True)
    assert tiny["relative"] == pytest.approx(expected_relative(lora_model), rel=1e-2) and 0 < tiny["relative"] < 1e-3
    warning = weight_update.barely_moved_warning(tiny, [{"loss": 1.2, "grad_norm": 0.4}], steps=2)
    assert warning and "barely moved" in warning and f"{tiny['relative']:.2g}" in warning and "2 steps" in warning
    set_lora_b(lora_model, 0.05)
    moved = weight_update.measure(lora_model, lora=True)
    assert moved["relative"] > weight_update.BARELY_MOVED
    assert weight_update.barely_moved_warning(moved, [{"loss": 1.2, "grad_norm": 0.4}], steps=2) is None
    flat = weight_update.barely_moved_warning(moved, [{"loss": 0.0, "grad_norm": 0.0}] * 2, steps=2)
    assert flat and "loss and grad norm were 0 at every logged step (2 logs over 2 steps)" in flat
    set_lora_b(lora_model, 0.0)


def test_full_fine_tuning_update_is_measured_on_a_sample(builtin_model):
    model = modeling.load_model(builtin_model, "float32")
    before = weight_update.weight_sample(model)
    assert sum(t.numel() for t in before.values()) <= weight_update.SAMPLE_ELEMENTS + len(before)
    assert weight_update.measure(model, lora=False, before=before)["relative"] == 0.0
    with torch.no_grad():
        for param in model.parameters():
            param.mul_(1.01)  # every weight moves by 1% of itself
    assert weight_update.measure(model, lora=False, before=before)["relative"] == pytest.approx(0.01, rel=1e-3)


def test_run_folder_base_reference_and_card_after_a_real_save(lora_model, builtin_model, tmp_path):
    """save_final's order: the adapter is saved with the resolved base (peft reads its config
    offline), then adapter_config.json gets the portable reference."""
    from rufus_data.models.merged_model import set_adapter_base

    lora_model.save_pretrained(tmp_path / "run")
    assert Path(ModelRef.of(tmp_path / "run").base.text).exists()
    set_adapter_base(tmp_path / "run", ModelRef.of(builtin_model).portable)
    assert ModelRef.of(tmp_path / "run").base.text == "smollm2-135m"
    assert modeling.load_tokenizer(str(tmp_path / "run")).name_or_path == builtin_model  # resolved at load time
