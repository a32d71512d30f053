"""Every stage of the first half runs two optimizer steps on CPU with LoRA on small real shards,
writes a checkpoint, and changes the adapter weights: mechanics, so on the built-in tiny-random
(smollm2-135m's tokenizer and template, random weights)."""

from __future__ import annotations

import json
import logging

import example_shards
import pyarrow as pa
import pytest
import torch
from train_helpers import assert_adapter_trained, one_torch_thread, run_tiny, tiny_config

from rufus_data.base.errors import RufusError
from rufus_train import modeling
from rufus_train.stages import get_stage
from rufus_train.trl_args import build_trl_args

pytestmark = pytest.mark.usefixtures("one_torch_thread")
_ = one_torch_thread  # the fixture is used through pytestmark


@pytest.fixture(scope="session")
def train_shards(tmp_path_factory, data_root):
    root = tmp_path_factory.mktemp("train_shards")
    return {
        "gsm8k_sft": example_shards.gsm8k_sft(data_root, root / "gsm8k_sft", limit=16, max_chars=350),
        "code_sft": example_shards.code_alpaca_sft(data_root, root / "code_sft", limit=16),
        "gsm8k_pref": example_shards.gsm8k_preference(data_root, root / "gsm8k_pref", limit=16, max_chars=350),
        "gsm8k_kto": example_shards.gsm8k_kto(data_root, root / "gsm8k_kto", limit=16, max_chars=350),
        "gsm8k_rl": example_shards.gsm8k_rl(data_root, root / "gsm8k_rl", limit=16, max_chars=350),
    }


@pytest.mark.train
def test_sft_trains_adapter_on_gsm8k_and_code_alpaca(train_shards, tiny_model, tmp_path):
    result = run_tiny("sft", [train_shards["gsm8k_sft"], train_shards["code_sft"]], tmp_path / "sft", model="tiny-random")
    assert_adapter_trained(result)
    out = result.output_dir
    for name in ("config.yaml", "train.log", "metrics.jsonl", "run.json", "adapter_model.safetensors"):
        assert (out / name).exists(), name
    run = json.loads((out / "run.json").read_text())
    assert run["global_step"] == 2 and run["lora"]["r"] == 4
    assert 0 < run["trainable_params"] < run["total_params"] / 100  # only the adapter trains
    # the base is recorded as a reference that loads anywhere (not the cache path), and named by the card
    assert json.loads((out / "adapter_config.json").read_text())["base_model_name_or_path"] == "tiny-random"
    assert run["base_model"] == "tiny-random" and run["dtype"] == "float32"
    card = (out / "README.md").read_text()
    assert "HuggingFaceTB/SmolLM2-135M-Instruct" in card and "[None]" not in card
    # how far the weights moved, and the warning a 2-step run earns
    assert run["weight_update"]["relative"] > 0 and "barely moved" in run["warning"]
    log = (out / "train.log").read_text()  # the libraries' logs, not only Rufus's
    assert "transformers.trainer: ***** Running training *****" in log and "rufus_train: step 2: " in log


@pytest.mark.train
def test_midtrain_packs_and_trains_every_token(train_shards, tiny_model, tmp_path):
    result = run_tiny("midtrain", train_shards["gsm8k_sft"], tmp_path / "mid", max_length=128, model=tiny_model)
    assert_adapter_trained(result)
    dataset = result.trainer.train_dataset
    # concatenated and cut into rows of exactly max_length (wrapped: no padding-free flattening)
    assert result.trainer.args.packing_strategy == "wrapped" and not result.trainer.padding_free
    assert {len(row) for row in dataset["input_ids"][:-1]} == {128}
    assert all(label != -100 for row in dataset["labels"][:4] for label in row)  # every token carries loss


@pytest.mark.train
def test_dpo_trains_adapter(train_shards, tiny_model, tmp_path):
    result = run_tiny("dpo", train_shards["gsm8k_pref"], tmp_path / "dpo", model=tiny_model)
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


@pytest.mark.train
def test_kto_reads_its_own_label_column(train_shards, tiny_model, tmp_path):
    result = run_tiny("kto", train_shards["gsm8k_kto"], tmp_path / "kto", model=tiny_model)
    assert_adapter_trained(result)
    assert "label" in result.trainer.train_dataset.column_names


@pytest.mark.train
def test_orpo_trains_adapter(train_shards, tiny_model, tmp_path):
    result = run_tiny("orpo", train_shards["gsm8k_pref"], tmp_path / "orpo", model=tiny_model)
    assert_adapter_trained(result)


@pytest.fixture(scope="session")
def perturbed_teacher(tmp_path_factory, tiny_model):
    """A teacher that differs from the student: tiny-random with seeded noise on every matrix."""
    teacher = modeling.load_model(tiny_model, "float32")
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for param in teacher.parameters():
            if param.dim() == 2:
                param.add_(torch.randn(param.shape, generator=generator) * param.std() * 0.3)
    folder = tmp_path_factory.mktemp("teacher") / "tiny-perturbed"
    teacher.to(torch.bfloat16).save_pretrained(folder)
    return folder


@pytest.mark.train
def test_distill_trains_student_toward_teacher(train_shards, tiny_model, perturbed_teacher, tmp_path):
    result = run_tiny(
        "distill", train_shards["gsm8k_rl"], tmp_path / "distill", teacher=str(perturbed_teacher), max_completion_length=32,
        model=tiny_model,
    )
    assert_adapter_trained(result)
    losses = [m["loss"] for m in result.metrics if "loss" in m]
    assert all(loss > 0 for loss in losses)  # a differing teacher gives a non-zero divergence
    assert result.trainer.args.beta == 1.0  # reverse KL by default


def trl_mask(tokenizer, messages: list[dict], tools: list | None = None) -> list[int]:
    """The assistant mask TRL's SFTTrainer builds for a template with markers (before truncation)."""
    return tokenizer.apply_chat_template(messages, tools=tools, tokenize=True, return_dict=True,
                                         return_assistant_tokens_mask=True)["assistant_masks"]


def test_sft_drops_examples_whose_assistant_tokens_all_fall_past_max_length(tiny_tokenizer, tmp_path, caplog):
    """Open Instruct's SFT filter: an example with every label masked after truncation is dropped
    before training and counted; one with at least one assistant token inside max_length stays."""
    def chat(question: str, answer: str) -> list[dict]:
        return [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]

    long_question = "Please read this carefully. " * 40  # well past 64 tokens before the answer starts
    conversations = [chat("What is 2 + 2?", "4"), chat(long_question, "Yes."), chat("Name a colour.", "Blue."),
                     chat(long_question, "No.")]
    rows = pa.table({"messages": conversations})
    config = tiny_config("sft", [], tmp_path / "sft", max_length=64)
    caplog.set_level(logging.INFO, logger="rufus_train")  # the count goes to train.log (and the console)
    dataset = get_stage("sft").build_dataset(config, rows, tiny_tokenizer)
    assert [m[0]["content"] for m in dataset["messages"]] == ["What is 2 + 2?", "Name a colour."]
    assert "2 of 4 examples dropped before training" in caplog.text and "max_length 64" in caplog.text
    # what was dropped is what TRL would have trained on nothing: no assistant token within 64
    assert sum(trl_mask(tiny_tokenizer, conversations[1])[:64]) == 0
    assert sum(trl_mask(tiny_tokenizer, conversations[1])) > 0
    # without the assistant-only loss nothing is dropped (every token trains)
    everything = tiny_config("sft", [], tmp_path / "sft2", max_length=64, assistant_only_loss=False)
    assert len(get_stage("sft").build_dataset(everything, rows, tiny_tokenizer)) == 4


def test_sft_drop_is_batched_and_keeps_the_rows_trl_masks_keep(tiny_tokenizer, data_root, monkeypatch):
    """The drop reads mix's batched counter (rows rendered and tokenised a batch at a time, never
    apply_chat_template row by row) and keeps exactly the rows whose TRL assistant mask has a 1
    within max_length: GSM8K chats and calculator tool-use traces (schemas in the system turn)."""
    from agent_traces import tool_call, tool_schemas, trace

    from rufus_train.grpo.tools import calculator
    from rufus_train.stages.sft import rows_with_loss

    gsm8k = [json.loads(line) for line in (data_root / "gsm8k" / "train.jsonl").read_text().splitlines()[:60]]
    conversations = [[{"role": "user", "content": r["question"]}, {"role": "assistant", "content": r["answer"]}]
                     for r in gsm8k]
    tools = [None] * len(conversations)
    for a in range(101, 111):
        conversations.append(trace(f"What is {a} * 7?", tool_call("calculator", expression=f"{a} * 7"),
                                   calculator(f"{a} * 7"), f"The answer is {a * 7}."))
        tools.append(tool_schemas(calculator))
    conversations = [[{k: v for k, v in m.items() if v is not None} for m in c] for c in conversations]
    lengths = (40, 80, 120, 300)
    expected = {n: [i for i, (c, t) in enumerate(zip(conversations, tools))
                    if sum(trl_mask(tiny_tokenizer, c, json.loads(t) if t else None)[:n])]
                for n in lengths}
    assert 0 < len(expected[80]) < len(conversations) and expected[300] != expected[40]  # the lengths cut between rows
    monkeypatch.setattr(tiny_tokenizer, "apply_chat_template", lambda *a, **k: pytest.fail("a row rendered alone"))
    assert {n: rows_with_loss(tiny_tokenizer, conversations, tools, n) for n in lengths} == expected


@pytest.mark.train
def test_dpo_apo_zero_trains_chosen_up(train_shards, tiny_model, tmp_path):
    """APO-zero (anchored preference optimisation): two steps on the same two pairs move the loss
    and raise the chosen answers' log-probabilities (logged before each step's update)."""
    result = run_tiny("dpo", train_shards["gsm8k_pref"], tmp_path / "apo", loss_type="apo_zero", max_rows=2,
                      learning_rate=5e-4, model=tiny_model)
    assert result.trainer.args.loss_type == ["apo_zero"]
    assert_adapter_trained(result, step=2)
    losses = [m["loss"] for m in result.metrics if "loss" in m]
    chosen = [m["logps/chosen"] for m in result.metrics if "logps/chosen" in m]
    assert losses[-1] < losses[0], losses
    assert chosen[-1] > chosen[0], chosen  # the anchor pushes chosen up, not only the margin


def test_gsm8k_calculations_on_small_numbers(data_root):
    """The learning check's task: GSM8K's one-operation calculations whose numbers are at most
    `max_operand`, each expression once, the same on every call; too few is a clear error."""
    items = example_shards.gsm8k_calculations(data_root, 576, max_operand=25)
    assert len({e for e, _ in items}) == 576
    for expression, value in items:
        a, op, b = expression.split(" ")
        assert max(int(a), int(b)) <= 25 and op in "+-*/" and int(value) == eval(expression)
    assert items == example_shards.gsm8k_calculations(data_root, 576, max_operand=25)
    with pytest.raises(RufusError, match="with operands up to 3"):
        example_shards.gsm8k_calculations(data_root, 1000, max_operand=3)


@pytest.mark.train
def test_online_dpo_ranks_the_policys_own_pairs_with_a_verifier(data_root, tiny_model, tmp_path):
    """Online DPO (TRL's experimental OnlineDPOTrainer): two sampled answers per prompt, the
    string-match verifier picks the chosen one, the reference is the policy with its adapter off."""
    items = example_shards.gsm8k_calculations(data_root, 4)
    shards = example_shards.calculation_rl(items, tmp_path / "rl")
    result = run_tiny("online_dpo", shards, tmp_path / "odpo", max_completion_length=12, temperature=1.0, model=tiny_model,
                      learning_rate=1e-3, gradient_checkpointing=True,  # the stage default
                      rewards=[{"name": "string_match", "extractor": "last_number", "answer_column": "expected_output"}])
    assert_adapter_trained(result)
    assert result.trainer.generation_config.use_cache  # sampling keeps its KV cache under gradient checkpointing
    assert result.trainer.ref_model is None  # reference log-probs come from the policy with its adapter off
    margins = [m["objective/scores_margin"] for m in result.metrics if "objective/scores_margin" in m]
    assert margins and min(margins) >= 0  # the chosen answer never scores below the rejected one
    assert all("logps/chosen" in m for m in result.metrics if "loss" in m)
