"""The `full` extractor: the whole completion is the answer (short free-text answers such as
"Paris", or a label), compared after the same normalisation as every other extractor, with the
gold read the same way unless `gold_extractor` says otherwise."""

from __future__ import annotations

from conftest import read_jsonl

from rufus_data.rewards import build_reward, extract_last_number
from rufus_data.rewards.extract import extract_full, get_extractor


def test_full_extractor_returns_the_completion_unchanged():
    assert get_extractor("full") is extract_full
    text = "  The answer is 42.\n\nThat is all. "
    assert extract_full(text) == text  # nothing cut: normalisation happens when comparing
    assert extract_full("") == ""  # an empty completion is an (empty) answer, not a missing one
    assert extract_last_number(text) == "42"  # where `last_number` would read only the number


def test_full_string_match_compares_whole_normalised_answers():
    reward = build_reward({"name": "string_match", "extractor": "full", "answer_column": "answer"})
    completions = ["Paris", "  paris. ", "Paris, France", "The capital is Paris", "$1,000$"]
    golds = ["Paris", "Paris", "Paris", "Paris", "1000"]
    # case, outer space, a final period, thousands commas and $ wrappers are normalised away; extra words are not
    assert reward(completions=completions, answer=golds) == [1.0, 1.0, 0.0, 0.0, 1.0]


def test_full_with_a_gold_extractor_reads_gsm8k_worked_answers(data_root):
    rows = read_jsonl(data_root / "gsm8k" / "test.jsonl", limit=3)
    reward = build_reward("string_match:full")  # the spec form: extractor full, gold in `solution`
    assert reward.extractor == "full" and reward.answer_column == "solution"
    gsm8k = build_reward({"name": "string_match", "extractor": "full", "gold_extractor": "gsm8k",
                          "answer_column": "answer"})
    finals = [row["answer"].split("####")[-1].strip() for row in rows]
    answers = [row["answer"] for row in rows]
    assert gsm8k(completions=finals, answer=answers) == [1.0, 1.0, 1.0]
    # a worked answer as the completion is not its final number under `full`
    assert gsm8k(completions=answers, answer=answers) == [0.0, 0.0, 0.0]
