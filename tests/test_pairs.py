"""`rufus-data pairs`: perturbed answers, strong vs weak (hf, weak = a randomly initialised copy
of the built-in architecture), and on-policy pairs through a real vLLM CPU server."""

from __future__ import annotations

import json
import random

import pytest
from rl_prompts import NUMBER_REWARD, arithmetic_rows, gsm8k_rows, write_rl_shards
from typer.testing import CliRunner

from rufus_data.cli import app
from rufus_data.errors import RufusError
from rufus_data.pairs import PairsConfig, build_pairs, perturb_final_answer
from rufus_data.shards import read_manifest, read_shards

GSM8K_REWARD = {"name": "string_match", "extractor": "gsm8k", "answer_column": "expected_output"}


def test_perturb_changes_only_the_final_answer():
    rng = random.Random(0)
    text = "She has 3 + 4 = 7 apples.\n#### 1,240"
    changed = perturb_final_answer(text, rng)
    head, tail = changed.rsplit("#### ", 1)
    assert head == "She has 3 + 4 = 7 apples.\n" and tail != "1,240" and tail.isdigit()
    assert perturb_final_answer("so the answer is \\boxed{12} and 3 steps", rng).endswith("and 3 steps")
    assert "\\boxed{12}" not in perturb_final_answer("so the answer is \\boxed{12} and 3 steps", rng)
    decimal = perturb_final_answer("It costs 2.50", rng)
    assert decimal != "It costs 2.50" and len(decimal.split(".")[1]) == 2 and float(decimal.split()[-1]) >= 0
    assert perturb_final_answer("no digits at all", rng) is None


def test_perturbed_gold_solutions_are_verified_pairs(tmp_path, data_root):
    rows = gsm8k_rows(data_root, 6)
    rows.append({**arithmetic_rows(1)[0], "id": "no-number", "solution": "It is the sum of both."})
    shards = write_rl_shards(tmp_path / "rl", rows)
    out = tmp_path / "pairs"
    result = CliRunner().invoke(
        app, ["pairs", str(shards), "--out", str(out), "--perturb-answer", "--require-verified",
              "--reward", json.dumps(GSM8K_REWARD)],
    )
    assert result.exit_code == 0, result.output
    table = read_shards(out).to_pylist()
    assert len(table) == 6
    for pair in table:
        chosen, rejected = pair["chosen"][0]["content"], pair["rejected"][0]["content"]
        assert chosen.rsplit("####", 1)[0] == rejected.rsplit("####", 1)[0] and chosen != rejected
        assert pair["chosen_reward"] == 1.0 and pair["rejected_reward"] == 0.0
        assert pair["chosen_model"] == "dataset:solution" and pair["rejected_model"] == "perturbed:dataset:solution"
    counts = read_manifest(out)["counts"]
    assert counts["dropped_no_answer_to_perturb"] == 1 and counts["pairs"] == 6
    assert "dropped_no_answer_to_perturb" in (out / "report.md").read_text()


def test_pairs_needs_a_method():
    with pytest.raises(RufusError, match="say how to build pairs"):
        PairsConfig().method()
    with pytest.raises(RufusError, match="need --reward"):
        PairsConfig(policy="smollm2-135m").method()


@pytest.fixture(scope="module")
def random_weak_model(builtin_model, tmp_path_factory) -> str:
    """The built-in architecture with random weights: a model that is surely worse."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("weak") / "random-smollm2"
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(builtin_model), dtype=torch.bfloat16)
    model.save_pretrained(folder)
    AutoTokenizer.from_pretrained(builtin_model).save_pretrained(folder)
    return str(folder)


def test_strong_vs_weak_pairs_in_trl_format(builtin_model, random_weak_model, tmp_path):
    from trl.data_utils import is_conversational

    shards = write_rl_shards(tmp_path / "rl", arithmetic_rows(6))
    common = {"strong": "smollm2-135m", "weak": random_weak_model, "max_tokens": 12, "seed": 1}
    summary = build_pairs([shards], tmp_path / "plain", PairsConfig(**common))
    rows = read_shards(tmp_path / "plain").to_pylist()
    assert len(rows) >= 5 and summary["counts"]["pairs"] == len(rows)
    for row in rows:
        assert is_conversational(row)
        assert row["chosen_model"] == "smollm2-135m" and row["rejected_model"] == random_weak_model
        assert row["prompt"][-1]["role"] == "user" and row["chosen"][0]["role"] == "assistant"
        assert row["chosen_sha256"] != row["rejected_sha256"]
        assert json.loads(row["sampling"])["strong"]["max_tokens"] == 12
        assert row["expected_output"]  # passthrough columns stay
    assert summary["chosen_rejected_length_ratio"] > 0
    assert "length ratio" in (tmp_path / "plain" / "report.md").read_text()

    verified = build_pairs([shards], tmp_path / "verified", PairsConfig(**common, reward=[NUMBER_REWARD]))
    counts = verified["counts"]
    assert counts["prompts"] == 6
    assert counts.get("pairs", 0) + counts.get("dropped_tied", 0) + counts.get("dropped_identical", 0) == 6
    assert counts.get("dropped_tied", 0) >= 1  # both wrong: a tie under the verifier, dropped


@pytest.mark.vllm
def test_on_policy_pairs_through_vllm(vllm_server, tmp_path):
    shards = write_rl_shards(tmp_path / "rl", arithmetic_rows(12))
    out = tmp_path / "pairs"
    config = PairsConfig(policy="smollm2-135m", k=4, reward=[NUMBER_REWARD], require_verified=True, backend="server",
                         base_urls=[vllm_server.base_url], max_tokens=24, temperature=0.7, seed=0)
    summary = build_pairs([shards], out, config)
    rows = read_shards(out).to_pylist()
    assert len(rows) >= 3, summary
    for row in rows:
        assert row["chosen_reward"] == 1.0 and row["rejected_reward"] == 0.0
        assert row["pair_method"] == "on_policy" and row["chosen_model"] == row["rejected_model"] == "smollm2-135m"
    counts = summary["counts"]
    assert counts["pairs"] + counts.get("dropped_all_samples_equal", 0) + counts.get("dropped_not_verified", 0) == 12
    assert read_manifest(out)["generation"]["policy"]["max_model_len_check"] == "ok"
