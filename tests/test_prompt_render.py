"""The prompts a DPO and a GRPO stage render, over every original template in the installed TRL
(as tests/test_chat_templates.py enumerates them, on the built-in vocabulary): render only, as the
TRL trainers render them (DPOTrainer: prompt with the generation prompt, prompt + reply, split
where their tokens diverge; GRPOTrainer: prompt with the generation prompt). The prompt ends where
the assistant begins, after the user's text, and holds none of the reply; a template that cannot
render prompts is refused before the model loads, with the reason docs/train.md names."""

from __future__ import annotations

import pytest
from test_chat_templates import FAMILIES, REFUSED

from rufus_data.folders.shards import read_shards
from rufus_data.models.chat_template import trl_templates_folder
from rufus_data.models.loss_mask import NoLossMask, check_prompt_render


@pytest.fixture(scope="module")
def stage_rows(data_root, tmp_path_factory):
    """(preference folder, rl folder): two gsm8k rows each."""
    import example_shards

    folder = tmp_path_factory.mktemp("render_shards")
    return (example_shards.gsm8k_preference(data_root, folder / "pref", limit=2, max_chars=300),
            example_shards.gsm8k_rl(data_root, folder / "rl", limit=2))


def family_tokenizer(tiny_model: str, family: str):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    tokenizer.chat_template = (trl_templates_folder() / f"{family}.jinja").read_text(encoding="utf-8")
    return tokenizer


def last_user(prompt: list[dict]) -> str:
    return next(m["content"] for m in reversed(prompt) if m["role"] == "user")


def replies(example: dict, columns: tuple[str, ...]) -> list[str]:
    return [m["content"] for column in columns for m in example[column] if m["role"] == "assistant"]


def dpo_split(tokenizer, example: dict) -> tuple[str, list[str]]:
    """DPOTrainer's tokenization of a conversational example, decoded: (prompt, [chosen, rejected])."""
    from trl.data_utils import _tokenize, common_prefix_length

    prompt_ids = _tokenize(tokenizer, example["prompt"], add_generation_prompt=True)["input_ids"]
    full = [_tokenize(tokenizer, example["prompt"] + example[column])["input_ids"] for column in ("chosen", "rejected")]
    cut = min(common_prefix_length(prompt_ids, ids) for ids in full)
    return tokenizer.decode(prompt_ids[:cut]), [tokenizer.decode(ids[cut:]) for ids in full]


@pytest.mark.parametrize("family", FAMILIES)
def test_dpo_and_grpo_stages_render_prompts(family, tiny_model, stage_rows, tmp_path):
    from train_helpers import tiny_config

    from rufus_train.stages import get_stage

    tokenizer = family_tokenizer(tiny_model, family)
    if family in REFUSED:
        with pytest.raises(NoLossMask, match=f"chat template {family} of tiny-random .*rufus_chatml") as refused:
            check_prompt_render(tokenizer, "tiny-random")
        assert REFUSED[family] in refused.value.reason
        return
    check_prompt_render(tokenizer, "tiny-random")
    pref, rl = stage_rows
    dpo = get_stage("dpo").build_dataset(tiny_config("dpo", pref, tmp_path / "dpo"), read_shards(pref), tokenizer)
    for example in dpo:
        prompt, completions = dpo_split(tokenizer, example)
        assert last_user(example["prompt"]) in prompt
        for reply, completion in zip(replies(example, ("chosen", "rejected")), completions, strict=True):
            assert reply not in prompt and reply.strip() in completion
            assert last_user(example["prompt"]) not in completion
    grpo_config = tiny_config("reasoning_rl", rl, tmp_path / "reasoning_rl", rewards=["string_match:gsm8k"])
    grpo = get_stage("reasoning_rl").build_dataset(grpo_config, read_shards(rl), tokenizer)
    for example in grpo:
        text = tokenizer.apply_chat_template(example["prompt"], add_generation_prompt=True, tokenize=False)
        bare = tokenizer.apply_chat_template(example["prompt"], tokenize=False)
        question = last_user(example["prompt"])
        assert question in text and text != bare  # the generation prompt opens the assistant turn after the question
        assert str(example["expected_output"]) not in text[text.index(question) + len(question):]


@pytest.mark.parametrize("stage", ["dpo", "reasoning_rl"])
def test_a_template_that_cannot_render_prompts_is_refused_before_the_model_loads(stage, stage_rows, tmp_path,
                                                                                monkeypatch):
    from train_helpers import run_tiny

    from rufus_train import modeling

    monkeypatch.setattr(modeling, "load_model", lambda *a, **k: pytest.fail("the model loaded"))
    data = stage_rows[0] if stage == "dpo" else stage_rows[1]
    extra = {"rewards": ["string_match:gsm8k"], "num_generations": 2} if stage == "reasoning_rl" else {}
    with pytest.raises(NoLossMask, match="chat template smolvlm of model .*renders? .*empty.*rufus_chatml"):
        run_tiny(stage, data, tmp_path / "run", chat_template="smolvlm", **extra)
