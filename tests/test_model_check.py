"""The models users bring (#43): `rufus-data models check` and the same table in `--dry_run`; a
tokenizer longer than the model's embeddings resized before training; a folder shaped like
Qwen2.5-0.5B-Instruct (tests/qwen_shaped.py) through the tulu3_mini pipeline."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
WIDE = {"COLUMNS": "300"}


@pytest.fixture(scope="module")
def grown_folder(tiny_model, tmp_path_factory) -> str:
    """The Qwen-shaped folder whose added tokens have no embedding rows."""
    from qwen_shaped import write_qwen2_5_shaped

    return str(write_qwen2_5_shaped(tiny_model, tmp_path_factory.mktemp("grown") / "grown", rows_for_added=False))


@pytest.fixture(scope="module")
def chats(tmp_path_factory, data_root):
    import example_shards

    return example_shards.gsm8k_sft(data_root, tmp_path_factory.mktemp("check_shards"), limit=4, max_chars=300)


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


def test_a_tokenizer_within_the_rows_changes_nothing(tiny_model):
    from transformers import AutoModelForCausalLM

    from rufus_data.models.embeddings import fit_embeddings

    model = AutoModelForCausalLM.from_pretrained(tiny_model)
    assert fit_embeddings(model, 49152) is None and fit_embeddings(model, 100) is None
    assert model.get_input_embeddings().weight.shape[0] == 49152