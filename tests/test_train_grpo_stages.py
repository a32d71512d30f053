"""Every GRPO stage runs two optimizer steps on CPU with the built-in SmolLM2-135M and LoRA on
small real shards (GSM8K, MBPP/HumanEval, IFEval) mixed with easy generated prompts, writes a
checkpoint, and changes the adapter; rewards vary inside groups (checked from the logged
`frac_reward_zero_std`). rlhf scores with a judge server the test starts on 127.0.0.1 and with a
sequence-classification reward-model checkpoint.

The verifier-scored stages need the real model: only a model that answers right some of the
time makes rewards differ inside a group (on tiny-random every group is dead and the adapter
never moves). rlhf's judge and reward model score any text differently, so it runs on tiny-random."""

from __future__ import annotations

import re

import pytest
from openai_stub import Request
from rl_stage_data import (
    arithmetic_rows,
    easy_code_rows,
    gsm8k_rows,
    humaneval_rows,
    ifeval_rows,
    mbpp_rows,
    search_corpus,
    write_rl_shards,
)
from train_helpers import assert_adapter_trained, run_tiny

GRPO_TINY = {"per_device_train_batch_size": 4, "num_generations": 2, "max_rows": None, "learning_rate": 1e-4}


@pytest.fixture(scope="session")
def rl_shards(tmp_path_factory, data_root):
    root = tmp_path_factory.mktemp("rl_shards")
    return {
        "math": write_rl_shards(root / "math", gsm8k_rows(data_root, 2) + arithmetic_rows(6)),
        "arithmetic": write_rl_shards(root / "arithmetic", arithmetic_rows(8)),
        "code": write_rl_shards(root / "code", mbpp_rows(data_root, 2) + humaneval_rows(data_root, 1) + easy_code_rows()),
        "ifeval": write_rl_shards(root / "ifeval", ifeval_rows(data_root, 6)),
    }


def assert_rewards_varied(result) -> None:
    zero_std = [m["frac_reward_zero_std"] for m in result.metrics if "frac_reward_zero_std" in m]
    assert zero_std and min(zero_std) < 1.0, f"every group was dead in every step: {zero_std}"


def run_grpo(stage, data, out, **overrides):
    result = run_tiny(stage, data, out, **{**GRPO_TINY, **overrides})
    assert_adapter_trained(result)
    assert_rewards_varied(result)
    return result


def code_rewards(**penalty) -> list[dict]:
    """The code stages' rewards at 32 completion tokens: the tests' passed fraction, DAPO's overlong penalty."""
    return [{"name": "code_execution", "pass_fraction": True},
            {"name": "overlong_penalty", "max_length": 32, "cache": 16, **penalty}]


@pytest.mark.model
def test_reasoning_rl_gsm8k_with_overlong_penalty(rl_shards, tmp_path):
    result = run_grpo("reasoning_rl", rl_shards["math"], tmp_path / "reasoning", max_completion_length=16)
    names = result.trainer.reward_func_names
    assert names == ["string_match_last_number", "overlong_penalty"]  # DAPO penalty added by default
    assert "rewards/overlong_penalty/mean" in result.metrics[0]


@pytest.mark.model
def test_coding_rl_sandboxed_code_reward(rl_shards, tmp_path):
    result = run_grpo("coding_rl", rl_shards["code"], tmp_path / "coding", max_completion_length=32,
                      rewards=code_rewards(weight=0.5))
    assert "rewards/code_execution/mean" in result.metrics[0]
    assert result.trainer.reward_weights.tolist() == [1.0, 0.5]


@pytest.mark.model
def test_if_rl_ifeval_verifiers(rl_shards, tmp_path):
    result = run_grpo("if_rl", rl_shards["ifeval"], tmp_path / "if", max_completion_length=24,
                      rewards=[{"name": "ifeval", "level": "instruction"},
                               {"name": "overlong_penalty", "max_length": 24, "cache": 12}])
    assert "rewards/ifeval/mean" in result.metrics[0] or any(k.startswith("rewards/ifeval") for k in result.metrics[0])


@pytest.mark.model
def test_general_agent_with_calculator_and_python_tools(rl_shards, tmp_path):
    result = run_grpo("general_agent", rl_shards["arithmetic"], tmp_path / "agent", max_completion_length=24)
    trainer = result.trainer
    assert [tool.__name__ for tool in trainer.tools] == ["calculator", "run_python"]
    assert trainer._tokenizer.response_template is not None  # tool calls are parsed back
    assert "tools/call_frequency" in result.metrics[0]


@pytest.mark.model
def test_coding_agent_with_sandboxed_environment(rl_shards, tmp_path):
    result = run_grpo("coding_agent", rl_shards["code"], tmp_path / "coding_agent", max_completion_length=32,
                      rewards=code_rewards())
    assert sorted(tool.__name__ for tool in result.trainer.tools) == ["run_python", "run_tests"]


@pytest.mark.model
def test_search_agent_over_local_duckdb_index(rl_shards, tmp_path):
    corpus = search_corpus(tmp_path / "corpus.jsonl")
    result = run_grpo("search_agent", rl_shards["arithmetic"], tmp_path / "search", max_completion_length=24,
                      search_corpus=str(corpus))
    assert (result.output_dir / "search_index.duckdb").exists()
    assert [tool.__name__ for tool in result.trainer.tools] == ["search"]


@pytest.fixture
def judge_server(openai_stub):
    """A real OpenAI-compatible judge on 127.0.0.1: 'Score: 9' when the graded answer has an even
    number of characters, else 'Score: 3' (so scores vary inside a group)."""
    seen = []

    def grade(request: Request) -> str:
        answer = re.search(r"\[Answer to grade\]\n(.*?)\n\nReply with", request.text, re.DOTALL).group(1)
        seen.append(answer)
        score = 9 if len(answer) % 2 == 0 else 3
        return f"Fine.\nScore: {score}"

    server = openai_stub(grade, models=["judge"], max_model_len=4096)
    return server.v1_url, seen


@pytest.fixture(scope="session")
def reward_model_dir(tmp_path_factory, tiny_model):
    """A sequence-classification checkpoint (tiny-random's body, a seeded one-logit score head)."""
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    torch.manual_seed(0)
    out = tmp_path_factory.mktemp("reward_model")
    model = AutoModelForSequenceClassification.from_pretrained(tiny_model, num_labels=1, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    model.config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


@pytest.mark.train
def test_rlhf_with_judge_server_and_reward_model(rl_shards, tiny_model, tmp_path, judge_server, reward_model_dir,
                                                 monkeypatch):
    url, seen = judge_server
    monkeypatch.delenv("JUDGE_BASE_URL", raising=False)
    result = run_grpo("rlhf", rl_shards["arithmetic"], tmp_path / "rlhf", max_completion_length=16,
                      judge_url=url, reward_model=str(reward_model_dir), reward_model_weight=0.5,
                      model=tiny_model)
    assert len(seen) == 2 * 4  # every completion of both steps went to the judge
    names = result.trainer.reward_func_names
    assert names[0] == "llm_judge" and len(names) == 2
    assert result.trainer.reward_weights.tolist() == [1.0, 0.5]
    first = result.metrics[0]
    assert first["rewards/llm_judge/std"] > 0 or result.metrics[1]["rewards/llm_judge/std"] > 0
