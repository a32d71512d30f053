"""`push_to_hub: ORG/NAME` on a stage, against the loopback Hub (tests/hub_stub.py): the run
arrives after Rufus's model card is written (TRL's own push is routed, never run), without its
checkpoints; the merged copy arrives with a card of its own carrying the checkpoint evaluation
as eval results. On tiny-random: mechanics."""

from __future__ import annotations

import json

import example_shards
import pytest
from hub_stub import hub
from huggingface_hub import ModelCard, constants
from train_helpers import one_torch_thread, run_tiny, tiny_config

from rufus_data.base.errors import RufusError
from rufus_train.config_loading import load_stage_config
from rufus_train.guards import check_push_token
from rufus_train.push import push_run
from rufus_train.stages import get_stage

pytestmark = pytest.mark.usefixtures("one_torch_thread")
_ = one_torch_thread

_ = hub  # the fixture, used by name
SMOLLM2 = "HuggingFaceTB/SmolLM2-135M-Instruct"  # tiny-random's upstream, as the card names it



@pytest.mark.train
def test_stage_pushes_the_adapter_after_its_card_then_the_merged_copy(hub, data_root, tiny_model, tmp_path):
    shards = example_shards.gsm8k_sft(data_root, tmp_path / "gsm8k_sft", limit=8, max_chars=350)
    result = run_tiny("sft", shards, tmp_path / "run", model="tiny-random",
                      trainer={"push_to_hub": True, "hub_model_id": "my-org/tiny-sft"})  # TRL's flags, routed
    assert result.trainer.args.push_to_hub is False  # TRL never pushed from save_model
    repo = hub.repos["my-org/tiny-sft"]
    assert repo.type == "model" and repo.private and len(repo.commits) == 1
    assert {"README.md", "adapter_model.safetensors", "adapter_config.json", "run.json", "config.yaml",
            "metrics.jsonl", "tokenizer.json"} <= set(repo.files)
    assert not [name for name in repo.files if name.startswith(("checkpoint-", "merged/", "eval_logs/"))]
    card = ModelCard(repo.files["README.md"].decode())
    assert repo.files["README.md"] == (result.output_dir / "README.md").read_bytes()  # Rufus's card, not TRL's
    assert card.data.base_model == SMOLLM2 and card.data.library_name == "peft" and "[None]" not in card.text
    print("stand-in Hub received (adapter):", json.dumps(sorted(repo.files)))
    print("card metadata (adapter):", json.dumps(card.data.to_dict(), indent=1))

    # the merged copy, with the last checkpoint evaluation as eval results (results.json as rufus-eval writes it)
    step = result.output_dir / "eval_logs" / "step-2"
    step.mkdir(parents=True)
    (step / "results.json").write_text(json.dumps({"tasks": {
        "gsm8k": {"metric": "avg@1", "value": 0.25, "k": 1, "docs": 8}, "ifeval": {"metric": "prompt_strict", "value": None}}}))
    push_run(result.output_dir, "my-org/tiny-sft-merged", merged=True)
    merged = hub.repos["my-org/tiny-sft-merged"]
    assert {"README.md", "config.json", "model.safetensors", "rufus-merged.json"} <= set(merged.files)
    card = ModelCard(merged.files["README.md"].decode())
    assert card.data.base_model == SMOLLM2 and card.data.library_name == "transformers" and "merged" in card.data.tags
    [evaluation] = card.data.eval_results  # the unscored task is no result
    assert (evaluation.dataset_name, evaluation.metric_type, evaluation.metric_value) == ("gsm8k", "avg@1", 0.25)
    assert "| gsm8k | avg@1 | 0.25 |" in card.text
    print("stand-in Hub received (merged):", json.dumps(sorted(merged.files)))
    print("card metadata (merged):", json.dumps(card.data.to_dict(), indent=1))


def test_trl_push_without_a_repo_and_a_bad_repo_are_refused_before_training(tmp_path, monkeypatch):
    config_class = get_stage("sft").config_class
    with pytest.raises(RufusError, match="write the stage key `push_to_hub: ORG/NAME`"):
        load_stage_config("sft", config_class, overrides={"trainer": {"push_to_hub": True}, "output_dir": str(tmp_path)})
    with pytest.raises(RufusError, match="names no owner"):
        load_stage_config("sft", config_class, overrides={"push_to_hub": "tiny-sft", "output_dir": str(tmp_path)})
    with pytest.raises(RufusError, match="push_merged pushes the merged copy of a LoRA run"):
        load_stage_config("sft", config_class, overrides={"push_merged": True, "output_dir": str(tmp_path)})
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(tmp_path / "no-token"))
    config = tiny_config("sft", tmp_path, tmp_path / "run", push_to_hub="my-org/x")
    with pytest.raises(RufusError, match="needs a Hub token with write access"):
        check_push_token(config.push_to_hub)
