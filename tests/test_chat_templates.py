"""Every chat template the installed TRL knows (its original templates, not the `_training` ones),
given to the built-in vocabulary with tiny-random: the route rufus_data/models/loss_mask.py takes,
mix's trainable counts, the mask Rufus trains with against the one TRL's SFTTrainer trains with,
token for token, and `stage sft` training a step on a family of each route."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from rufus_data.models.chat_template import trl_templates_folder
from rufus_data.models.loss_mask import NoLossMask, decide_loss_mask
from rufus_data.sources.tokens import TokenCounter

REPO = Path(__file__).resolve().parents[1]
FAMILIES = sorted(p.stem for p in trl_templates_folder().glob("*.jinja") if not p.stem.endswith("_training"))
# vision-language templates that read `content` only as typed blocks: text raises, or renders empty turns
REFUSED = {"idefics3": "renders plain-text messages empty", "smolvlm": "renders plain-text messages empty",
           "llava_next": "cannot render a plain-text chat"}
CHATS = [
    [{"role": "user", "content": "What is 12 * 3?"}, {"role": "assistant", "content": "12 * 3 = 36."}],
    [{"role": "user", "content": "Name a colour."}, {"role": "assistant", "content": "Blue."},
     {"role": "user", "content": "Another?"}, {"role": "assistant", "content": "Green, like grass."}],
    [{"role": "user", "content": "Think: 2 + 2?"},
     {"role": "assistant", "content": "4", "reasoning_content": "Two plus two is four."}],
    [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello", "reasoning_content": "greet"},
     {"role": "user", "content": "Bye"}, {"role": "assistant", "content": "Goodbye", "reasoning_content": "farewell"}],
]


def routes_script():
    spec = importlib.util.spec_from_file_location("chat_template_routes", REPO / "scripts" / "chat_template_routes.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def family_tokenizer(tiny_model):
    """A fresh tiny-random tokenizer given one TRL original template (the tokenizer a model of that family has)."""
    from transformers import AutoTokenizer

    def make(family: str):
        tokenizer = AutoTokenizer.from_pretrained(tiny_model)
        tokenizer.chat_template = (trl_templates_folder() / f"{family}.jinja").read_text(encoding="utf-8")
        return tokenizer

    return make


def trl_trains(tokenizer, chat: list[dict]) -> tuple[list[int], list[int]]:
    """(input ids, assistant mask) as SFTTrainer makes them with assistant_only_loss: its training
    template swapped in when the template has no markers, then its own tokenize function."""
    from trl.chat_template_utils import get_training_chat_template, has_generation_markers
    from trl.data_utils import _tokenize

    template = None if has_generation_markers(tokenizer.chat_template) else get_training_chat_template(tokenizer)
    out = _tokenize(tokenizer, chat, chat_template=template, tools=None, return_assistant_tokens_mask=True)
    return out["input_ids"], out["assistant_masks"]


def turn_by_turn(tokenizer, chat: list[dict]) -> tuple[list[int], list[int]] | None:
    """Open Instruct's turn-by-turn mask, on the rendered text: each reply's characters run from
    the end of the chat before it (rendered with the generation prompt) to the end of the chat
    through it, and a token carries loss when it overlaps them (transformers' rule). In tokens the
    prefixes need not hold (this vocabulary splits `\n\n12` unlike `\n\n`), in text they must:
    None when they do not."""
    def text(messages, prompt=False):
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=prompt)

    whole = text(chat)
    spans = []
    for turn, message in enumerate(chat):
        if message["role"] == "assistant":
            before, through = text(chat[:turn], prompt=True), text(chat[: turn + 1])
            if not (whole.startswith(through) and through.startswith(before)):
                return None
            spans.append((len(before), len(through)))
    encoded = tokenizer(whole, add_special_tokens=False, return_offsets_mapping=True)
    mask = [int(any(start < end and stop > begin for begin, end in spans)) for start, stop in encoded["offset_mapping"]]
    return encoded["input_ids"], mask


@pytest.mark.parametrize("family", FAMILIES)
def test_rufus_masks_what_trl_trains(family, family_tokenizer):
    """The route taken, mix's trainable counts (its batched counter, kind sft) equal to the masks,
    and each mask token for token what TRL's SFTTrainer trains with (routes 1 and 2), or Open
    Instruct's turn-by-turn mask (route 3, whose masks the stage hands TRL); a refused template
    says why, by name."""
    tokenizer = family_tokenizer(family)
    if family in REFUSED:
        with pytest.raises(NoLossMask, match=f"chat template {family} .*rufus_chatml") as refused:
            decide_loss_mask(tokenizer, "tiny-random")
        assert REFUSED[family] in refused.value.reason
        return
    counter = TokenCounter(tokenizer)
    rows = [{"messages": chat} for chat in CHATS]
    chats = CHATS
    if counter.loss.route == "prefixes":
        expected = [turn_by_turn(tokenizer, chat) for chat in CHATS]
        rewrites = [i for i, e in enumerate(expected) if e is None]
        for i in rewrites:  # a row whose earlier turns render differently once later ones follow: refused, by row
            with pytest.raises(NoLossMask, match=f"conversation 0: for its message .*chat template {family}|"
                                                 f"chat template {family}, conversation 0"):
                counter.token_masks([CHATS[i]])
        chats = [chat for i, chat in enumerate(CHATS) if i not in rewrites]
        rows = [{"messages": chat} for chat in chats]
        expected = [e for e in expected if e is not None]
    else:
        expected = [trl_trains(tokenizer, chat) for chat in chats]
    masks = counter.token_masks(chats)
    assert [(ids, mask) for ids, mask in masks] == [(list(ids), list(mask)) for ids, mask in expected]
    [(_, counts)] = list(counter.count_batches([rows], "sft"))
    assert counts.trainable == [sum(mask) for _, mask in masks] and all(counts.trainable)
    assert counts.total == [len(ids) for ids, _ in masks]


def test_docs_table_is_the_generated_one(tiny_model):
    """docs/train.md holds the families x route table the script generates from the installed TRL."""
    from transformers import AutoTokenizer

    script = routes_script()
    generated = script.table(script.route_rows(AutoTokenizer.from_pretrained(tiny_model)))
    assert script.docs_table((REPO / "docs" / "train.md").read_text()) == generated
    assert {line.split("`")[1] for line in generated.splitlines() if "| refused |" in line} == set(REFUSED)


# one or two families of each route: every family trains the same code path as the others of its route
TRAINED = {"lfm2_2_5": "markers", "qwen2_5": "trl_training_template", "qwen3": "trl_training_template",
           "llama3": "trl_training_template", "llama3_1": "prefixes", "gemma4": "prefixes"}


@pytest.fixture(scope="module")
def gsm8k_chats(tmp_path_factory, data_root):
    import example_shards

    return example_shards.gsm8k_sft(data_root, tmp_path_factory.mktemp("template_shards"), limit=4, max_chars=300)


# every other family trains too: the opt-in slow run (make test-slow), about 10 s a family
TRAINED_SLOW = [pytest.param(family, marks=pytest.mark.slow) for family in FAMILIES
                if family not in TRAINED and family not in REFUSED]


@pytest.mark.train
@pytest.mark.parametrize("family", sorted(TRAINED) + TRAINED_SLOW)
def test_stage_sft_trains_a_step_with_the_family_template(family, gsm8k_chats, tmp_path):
    """`stage sft` with `chat_template: FAMILY` (a shipped name) trains one step on the labels Rufus
    counts; run.json records the template and the route, and the run saves the template with the model."""
    from train_helpers import run_tiny
    from transformers import AutoTokenizer

    from rufus_data.folders.run_folder import read_run_json
    from rufus_data.folders.shards import read_shards
    from rufus_train.stage_base import conversational

    # max_length 1024 (TRL's default): cohere2's template opens every chat with a preamble of some 400 tokens
    result = run_tiny("sft", gsm8k_chats, tmp_path / "run", max_steps=1, save_steps=1, max_rows=4, chat_template=family,
                      max_length=1024)
    assert result.global_step == 1
    summary = read_run_json(result.output_dir)
    assert summary["loss_mask"]["route"] == TRAINED.get(family, summary["loss_mask"]["route"])
    assert summary["loss_mask"]["route"] in ("markers", "trl_training_template", "prefixes")
    assert summary["chat_template"]["name"] == family
    assert summary["chat_template"]["source"] == family
    template = (trl_templates_folder() / f"{family}.jinja").read_text(encoding="utf-8")
    assert AutoTokenizer.from_pretrained(result.output_dir).chat_template == template  # saved with the model
    tokenizer = result.trainer.processing_class
    max_length = result.trainer.args.max_length
    masks = TokenCounter(tokenizer).token_masks(conversational(read_shards(gsm8k_chats), "messages"))
    counted = {tuple(ids[:max_length]): mask[:max_length] for ids, mask in masks}
    trained = result.trainer.train_dataset
    assert len(trained) == 4
    for ids, labels in zip(trained["input_ids"], trained["labels"], strict=True):
        assert [int(label != -100) for label in labels] == counted[tuple(ids)]


def test_base_model_without_a_template_is_refused_before_it_loads(gsm8k_chats, tiny_model, tmp_path, monkeypatch):
    """A base model ships no chat template: a conversational stage that names none is refused,
    saying what to set, before the weights load; `--show_mask` reads the named one."""
    import shutil

    from train_helpers import run_tiny

    from rufus_data.base.errors import RufusError
    from rufus_train import modeling
    from rufus_train.mask import loss_mask

    base = tmp_path / "base"
    shutil.copytree(tiny_model, base, ignore=shutil.ignore_patterns("*chat_template*", "rufus-model.json"))
    monkeypatch.setattr(modeling, "load_model", lambda *a, **k: pytest.fail("the model loaded"))
    with pytest.raises(RufusError, match="has no chat template .*set `chat_template:`.*rufus_chatml"):
        run_tiny("sft", gsm8k_chats, tmp_path / "run", model=str(base))
    tokenizer = modeling.load_tokenizer(str(base), "rufus_chatml")
    example = loss_mask(tokenizer, [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}],
                        assistant_only=True, max_length=None)
    assert tokenizer.decode([i for i, bit in zip(example.input_ids, example.loss_mask) if bit]) == "Hello<|im_end|>"


def test_mix_counts_a_family_template_named_by_its_shipped_name(tmp_path, data_root):
    """`chat_template: qwen2_5` in a catalog with `basis: trainable`: counted through TRL's training
    template (once refused: the template has no {% generation %} markers), the route in the manifest."""
    import yaml

    from rufus_data.folders.shards import read_shards
    from rufus_data.mix import mix

    catalog = tmp_path / "catalog.yaml"
    catalog.write_text(yaml.safe_dump({"kind": "sft", "name": "qwen", "chat_template": "qwen2_5", "basis": "trainable",
                                       "budget": 2000, "sources": [{"name": "gsm8k", "share": 1.0,
                                                                    "path": str(data_root / "gsm8k/train.jsonl")}]}))
    result = mix(catalog, tmp_path / "out")
    manifest = json.loads((result.out / "manifest.json").read_text())
    assert manifest["loss_mask"] == {**manifest["loss_mask"], "route": "trl_training_template", "chat_template": "qwen2_5"}
    rows = read_shards(result.out).to_pylist()
    assert rows and all(0 < row["num_trainable_tokens"] < row["num_tokens"] for row in rows)
