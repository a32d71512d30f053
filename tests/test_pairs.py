"""`rufus-data pairs`: perturbed answers, strong vs weak (hf, weak = tiny-random, a randomly
initialised miniature of the built-in architecture), and on-policy pairs through a real vLLM CPU
server."""

from __future__ import annotations

import json
import random
import shutil
import subprocess

import pytest
from rl_prompts import NUMBER_REWARD, arithmetic_rows, gsm8k_rows, write_rl_shards
from test_filter import RUFUS_DATA, _kill_midway
from typer.testing import CliRunner

from rufus_data.base.errors import RufusError
from rufus_data.cli import app
from rufus_data.folders.output_step import StepResult
from rufus_data.folders.shards import read_manifest, read_shards
from rufus_data.rollouts.pairs import PairsConfig, build_pairs, make_pairs, perturb_final_answer
from rufus_data.rollouts.prompts import read_prompt_rows
from rufus_data.rollouts.scoring import Scorer

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


def test_report_always_shows_the_no_answer_to_perturb_count(tmp_path, data_root):
    shards = write_rl_shards(tmp_path / "rl", gsm8k_rows(data_root, 2))
    result = CliRunner().invoke(app, ["pairs", str(shards), "--out", str(tmp_path / "p"), "--perturb-answer"])
    assert result.exit_code == 0, result.output
    assert read_manifest(tmp_path / "p")["counts"]["dropped_no_answer_to_perturb"] == 0
    assert "| dropped_no_answer_to_perturb | 0 |" in (tmp_path / "p" / "report.md").read_text()


def test_limit_pairs_a_seeded_sample_of_the_prompts(tmp_path, data_root):
    """`pairs --limit N`: the same N prompts on every run with one seed, in their input order."""
    rows = gsm8k_rows(data_root, 8)
    shards = write_rl_shards(tmp_path / "rl", rows)
    picked = []
    for out in ("a", "b"):
        result = CliRunner().invoke(app, ["pairs", str(shards), "--out", str(tmp_path / out), "--perturb-answer",
                                          "--limit", "3"])
        assert result.exit_code == 0, result.output
        manifest = read_manifest(tmp_path / out)
        assert manifest["counts"]["prompts"] == 3 and manifest["config"]["limit"] == 3
        picked.append([r["id"] for r in read_shards(tmp_path / out).to_pylist()])
    order = [r["id"] for r in rows]
    assert picked[0] == picked[1] and len(picked[0]) == 3
    assert picked[0] == sorted(picked[0], key=order.index) and picked[0] != order[:3]  # a sample, not the head


def test_pairs_cli_passes_every_sampling_and_server_option(tmp_path, monkeypatch):
    import rufus_data.rollouts.pairs

    seen = {}

    def capture(shards, out, config, overwrite=False, show_progress=False):
        seen["config"] = config
        return StepResult(out=out, manifest={"method": config.method(), "chosen_rejected_length_ratio": None})

    monkeypatch.setattr(rufus_data.rollouts.pairs, "build_pairs", capture)
    result = CliRunner().invoke(app, [
        "pairs", str(tmp_path), "--out", str(tmp_path / "p"), "--strong", "a", "--weak", "b", "--top-k", "20",
        "--min-p", "0.05", "--repetition-penalty", "1.1", "--max-model-len", "4096", "--served-model-name", "served",
    ])
    assert result.exit_code == 0, result.output
    config = seen["config"]
    assert (config.top_k, config.min_p, config.repetition_penalty) == (20, 0.05, 1.1)
    assert config.max_model_len == 4096 and config.served_model_name == "served"
    assert config.access().max_model_len == 4096 and config.sampling(1).top_k == 20
    help_text = " ".join(CliRunner().invoke(app, ["pairs", "--help"], env={"COLUMNS": "200"}).output.split())
    for option in ("--top-k", "--min-p", "--repetition-penalty", "--max-model-len", "--served-model-name"):
        assert option in help_text
    assert "[default: 1.0]" in help_text and "$RUFUS_VLLM_COMMAND, else `vllm serve`" in help_text


def test_on_policy_pairs_contrast_a_passing_and_a_failing_sample(data_root):
    """Chosen passes (reward >= pass_threshold), rejected fails; non-binary rewards that all fail
    (or all pass) give no pair, whatever their spread."""
    rows = arithmetic_rows(4)
    rewards = {"add-1-1": [0.9, 0.6, 0.3, 0.6], "add-2-3": [1.0, 0.8, 0.2, 1.0], "add-4-5": [1.0] * 4,
               "add-5-4": [0.5, None, 0.25, 0.75]}
    samples = {"policy": {pid: {"texts": [f"{pid} sample {i}" for i in range(4)], "rewards": r}
                          for pid, r in rewards.items()}}
    scorer = Scorer.from_specs([NUMBER_REWARD])
    config = PairsConfig(policy="m", k=4, reward=[NUMBER_REWARD])
    pairs, counts = make_pairs(rows, config, "on_policy", samples, scorer)
    assert [(p["id"], p["chosen_reward"], p["rejected_reward"]) for p in pairs] == [("add-2-3", 1.0, 0.2)]
    assert pairs[0]["chosen"][0]["content"] == "add-2-3 sample 0" and pairs[0]["rejected"][0]["content"] == "add-2-3 sample 2"
    assert counts["dropped_no_pass_fail_split"] == 3 and counts["pairs"] == 1

    lower = PairsConfig(policy="m", k=4, reward=[NUMBER_REWARD], pass_threshold=0.5)
    pairs, counts = make_pairs(rows, lower, "on_policy", samples, scorer)
    assert [(p["id"], p["chosen_reward"], p["rejected_reward"]) for p in pairs] == [
        ("add-1-1", 0.9, 0.3), ("add-2-3", 1.0, 0.2), ("add-5-4", 0.75, 0.25)]
    assert counts["dropped_no_pass_fail_split"] == 1


def test_config_hash_follows_input_content_not_its_path(tmp_path):
    first = write_rl_shards(tmp_path / "a" / "rl", arithmetic_rows(3))
    copy = tmp_path / "elsewhere" / "rl"
    shutil.copytree(first, copy)
    changed = write_rl_shards(tmp_path / "b" / "rl", arithmetic_rows(2))
    config = PairsConfig(policy="m", k=4, reward=[NUMBER_REWARD], backend="hf")
    hashes = [config.config_hash("policy", "m", 4, read_prompt_rows([f])[2]) for f in (first, copy, changed)]
    assert hashes[0] == hashes[1] != hashes[2]


def test_pairs_needs_a_method():
    with pytest.raises(RufusError, match="say how to build pairs"):
        PairsConfig().method()
    with pytest.raises(RufusError, match="need --reward"):
        PairsConfig(policy="smollm2-135m").method()


@pytest.fixture(scope="module")
def random_weak_model(tiny_model) -> str:
    """The built-in architecture with random weights (tiny-random): a model that is surely worse."""
    return tiny_model


def test_strong_vs_weak_pairs_in_trl_format(builtin_model, random_weak_model, tmp_path):
    from trl.data_utils import is_conversational

    shards = write_rl_shards(tmp_path / "rl", arithmetic_rows(6))
    common = {"strong": "smollm2-135m", "weak": random_weak_model, "max_tokens": 12, "seed": 1}
    summary = build_pairs([shards], tmp_path / "plain", PairsConfig(**common))
    rows = read_shards(tmp_path / "plain").to_pylist()
    assert len(rows) >= 5 and summary.counts["pairs"] == len(rows)
    for row in rows:
        assert is_conversational(row)
        assert row["chosen_model"] == "smollm2-135m" and row["rejected_model"] == random_weak_model
        assert row["prompt"][-1]["role"] == "user" and row["chosen"][0]["role"] == "assistant"
        assert row["chosen_sha256"] != row["rejected_sha256"]
        assert json.loads(row["sampling"])["strong"]["max_tokens"] == 12
        assert row["expected_output"]  # passthrough columns stay
    assert summary.manifest["chosen_rejected_length_ratio"] > 0
    assert "length ratio" in (tmp_path / "plain" / "report.md").read_text()

    verified = build_pairs([shards], tmp_path / "verified", PairsConfig(**common, reward=[NUMBER_REWARD]))
    counts = verified.counts
    assert counts["prompts"] == 6
    assert counts.get("pairs", 0) + counts.get("dropped_tied", 0) + counts.get("dropped_identical", 0) == 6
    assert counts.get("dropped_tied", 0) >= 1  # both wrong: a tie under the verifier, dropped
    assert counts["pairs"] >= 1 and counts["swapped_by_reward"] == 0

    # the roles reversed (the random model as "strong"): the reward outranks the model order and
    # swaps every pair back, so the real model's right answers are still chosen
    reversed_ = build_pairs([shards], tmp_path / "reversed",
                            PairsConfig(**{**common, "strong": random_weak_model, "weak": "smollm2-135m"},
                                        reward=[NUMBER_REWARD]))
    assert reversed_.counts["swapped_by_reward"] == reversed_.counts["pairs"] == counts["pairs"]
    keep = ("id", "chosen", "rejected", "chosen_model", "rejected_model", "chosen_reward", "rejected_reward")
    assert ([{k: r[k] for k in keep} for r in read_shards(tmp_path / "reversed").to_pylist()]
            == [{k: r[k] for k in keep} for r in read_shards(tmp_path / "verified").to_pylist()])
    assert all(r["chosen_model"] == "smollm2-135m" for r in read_shards(tmp_path / "reversed").to_pylist())
    # --require-verified judges the pair after that swap: the same pairs survive, none dropped
    strict = build_pairs([shards], tmp_path / "reversed_verified",
                         PairsConfig(**{**common, "strong": random_weak_model, "weak": "smollm2-135m"},
                                     reward=[NUMBER_REWARD], require_verified=True))
    assert strict.counts["pairs"] == counts["pairs"] and strict.counts.get("dropped_not_verified", 0) == 0
    assert ([{k: r[k] for k in keep} for r in read_shards(tmp_path / "reversed_verified").to_pylist()]
            == [{k: r[k] for k in keep} for r in read_shards(tmp_path / "verified").to_pylist()])


@pytest.mark.model  # pairs need a policy that passes some of the time: the real model
@pytest.mark.spawn
def test_on_policy_pairs_resume_after_sigkill(tmp_path):
    """hf on-policy pairs, killed mid-run and started again: no prompt lost or generated twice,
    and the same pairs as an uninterrupted run (per-prompt seeds)."""
    shards = write_rl_shards(tmp_path / "rl", arithmetic_rows(8))
    settings = {"k": 4, "max_tokens": 12, "temperature": 0.7, "seed": 0}
    uninterrupted = build_pairs([shards], tmp_path / "whole", PairsConfig(policy="smollm2-135m", reward=[NUMBER_REWARD],
                                                                          **settings))
    out = tmp_path / "resumed"
    args = ["pairs", str(shards), "--out", str(out), "--policy", "smollm2-135m", "--reward", json.dumps(NUMBER_REWARD),
            "--k", "4", "--max-tokens", "12", "--temperature", "0.7", "--seed", "0"]
    before_kill = _kill_midway(args, out, at_least=3)
    assert 3 <= len(before_kill) < 8
    done = subprocess.run([RUFUS_DATA, *args], check=False, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    generation = read_manifest(out)["generation"]["policy"]
    assert generation["prompts_resumed"] == len(before_kill)
    assert generation["prompts_generated"] == 8 - len(before_kill)
    rows = read_shards(out).to_pylist()
    assert len({r["id"] for r in rows}) == len(rows) == uninterrupted.counts["pairs"] >= 1
    assert read_manifest(out)["counts"] == uninterrupted.counts
    keep = ("id", "chosen", "rejected", "chosen_reward", "rejected_reward")
    assert [{k: r[k] for k in keep} for r in rows] == [{k: r[k] for k in keep} for r in read_shards(tmp_path / "whole").to_pylist()]
    for record in before_kill:  # samples journaled before the kill are the ones paired
        pair = next((r for r in rows if r["id"] == record["prompt_id"]), None)
        if pair is not None:
            assert pair["chosen"][0]["content"] in record["texts"] and pair["rejected"][0]["content"] in record["texts"]
    for row in rows:
        assert row["chosen_reward"] >= 1.0 > row["rejected_reward"]  # no --require-verified: still pass vs fail


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
    counts = summary.counts
    assert counts["pairs"] + counts["dropped_no_pass_fail_split"] + counts["dropped_not_verified"] == 12
    assert read_manifest(out)["generation"]["policy"]["max_model_len_check"] == "ok"


# --- the reference answer, rewards from the data, token counts of the pair -----------------------
def test_perturbed_reference_answers_from_a_catalog_with_its_own_rewards(tmp_path, tiny_tokenizer):
    """`pairs catalogs/rl.yaml --perturb-answer`: the catalog is mixed first; rows without a
    `solution` use their `expected_output` (catalogs/rl.yaml's word problems), each pair is scored
    by its source's reward (no --reward), and its token counts are the pair's, not the prompt's."""
    out = tmp_path / "pairs"
    result = CliRunner().invoke(app, ["pairs", "catalogs/rl.yaml", "--perturb-answer", "--require-verified",
                                      "--out", str(out)])
    assert result.exit_code == 0, result.output
    manifest = read_manifest(out)
    counts = manifest["counts"]
    assert counts["prompts"] == 385 and counts["dropped_no_reference_answer"] == 0  # 101 have no `solution`
    assert counts["pairs"] == 385 - counts["dropped_no_answer_to_perturb"] - counts["dropped_not_verified"] > 300
    assert manifest["rewards"]["from"].startswith("data") and len(manifest["rewards"]["specs"]) == 2
    rows = read_shards(out).to_pylist()
    by_source = {r["source"]: r for r in rows}
    assert by_source["word_problems"]["chosen_model"] == "dataset:expected_output"
    assert by_source["arithmetic"]["chosen_model"] == "dataset:solution"
    for row in rows:
        assert (row["chosen_reward"], row["rejected_reward"]) == (1.0, 0.0)
        assert "pass_rate" not in row
        chosen = tiny_tokenizer.apply_chat_template(row["prompt"] + row["chosen"], tokenize=True)
        rejected = tiny_tokenizer.apply_chat_template(row["prompt"] + row["rejected"], tokenize=True)
        prompt = tiny_tokenizer.apply_chat_template(row["prompt"], tokenize=True)
        length = (lambda ids: len(ids["input_ids"] if hasattr(ids, "keys") else ids))
        assert (row["num_tokens"], row["num_rejected_tokens"]) == (length(chosen), length(rejected))
        assert 0 < row["num_trainable_tokens"] < row["num_tokens"] - length(prompt) + 3  # the chosen reply
    assert manifest["tokenizer"] == "smollm2-135m"


def test_pairs_score_with_the_llm_judge_and_the_overlong_penalty(openai_stub, tmp_path, data_root, tiny_model):
    """Rewards beyond string matching: the async judge (stand-in server) and the overlong penalty,
    on the rows' own answers (token ids from the pair's tokenizer) and on hf samples, whose
    report counts the samples cut at --max-tokens."""
    from test_filter_cli import _judged

    stub = openai_stub(lambda request: _judged(request.text), models=["judge-model"])
    judge = {"name": "llm_judge", "base_url": stub.v1_url, "reference_column": "expected_output"}
    overlong = {"name": "overlong_penalty", "max_length": 4096, "cache": 64}
    shards = write_rl_shards(tmp_path / "rl", gsm8k_rows(data_root, 3))
    perturbed = build_pairs([shards], tmp_path / "perturbed",
                            PairsConfig(perturb_answer=True, require_verified=True, reward=[judge, overlong]))
    assert perturbed.counts["pairs"] == 3 and len(stub.requests) == 6
    assert all((r["chosen_reward"], r["rejected_reward"]) == (1.0, 0.0) for r in read_shards(tmp_path / "perturbed").to_pylist())

    short = {"name": "overlong_penalty", "max_length": 4, "cache": 2}
    sampled = build_pairs([shards], tmp_path / "sampled", PairsConfig(policy="tiny-random", k=2, max_tokens=4,
                                                                        reward=[judge, short]))
    assert len(stub.requests) == 6 + 6  # one judge request per sample
    generation = read_manifest(tmp_path / "sampled")["generation"]["policy"]
    assert generation["finish_length"] == 6  # 4 tokens never finish a GSM8K answer
    assert "| policy | 3 | 0 | 3 |" in (tmp_path / "sampled" / "report.md").read_text()
    assert sampled.counts["prompts"] == 3
