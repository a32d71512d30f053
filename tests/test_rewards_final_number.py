"""The eval tasks' final-number scorer (`final_number`): the final answer as published GSM8K and
GSM-Plus evaluations read it, compared as a number; `string_match` stays as narrow as it was."""

from __future__ import annotations

import pytest
from conftest import read_jsonl

from rufus_data.rewards import build_reward, extract_final_number, number_value, says_unanswerable

GOLD = "Janet sells 16 - 3 - 4 = <<16-3-4=9>>9 duck eggs a day.\nShe makes 9 * 2 = $<<9*2=18>>18.\n#### 18"


@pytest.mark.parametrize(("text", "number"), [
    ("She makes 9 * $2 = $18 every day.\n#### $18.00", "18.00"),
    ("Claire will eat #### 7 dozen eggs in 4 weeks.", "7"),  # words after the final answer
    ("So 100 / 25 = 4 pens.\nThe answer is: 4", "4"),
    ("#### 18\nThe answer is: 18", "18"),
    ("The total is 3 + 4 = 7 apples, so\n#### 5 + 3 = 8 apples", "8"),  # after the line's last `=`
    ("First she had 12, then 1,000 more: \\boxed{1,012} cookies in 3 boxes", "1,012"),
    ("The answer is\n\n42 marbles, not 40", "42"),  # the marker ends its line: the next line holds it
    ("It is 3/4 of the cake", "3/4"),
    ("She pays 2023-2024 fees of -5 and then 12", "12"),  # no marker: the last number
    ("so 12 in all. #### a dozen", "12"),  # no number after the marker: the last number
    ("no number at all", None),
])
def test_final_number_is_read_after_the_marker_else_last(text, number):
    assert extract_final_number(text) == number


def test_numbers_compare_by_value():
    assert number_value("16.00") == number_value("16") == number_value("+16")
    assert number_value("1,000") == 1000 and number_value("0.25") == number_value("1/4")
    assert number_value("1/0") is None and number_value(None) is None


def test_final_number_reward_against_gsm8k_gold():
    reward = build_reward({"name": "final_number", "answer_column": "answer"})
    answers = ["#### $18.00", "Janet makes #### 18 dollars every day at the farmers' market.", "18 eggs... #### 9",
               "<think>it is 18</think>The answer is 19", "<think>never closed 18", "The answer is: 18."]
    assert reward(completions=answers, answer=[GOLD] * len(answers)) == [1.0, 1.0, 0.0, 0.0, 0.0, 1.0]
    # a gold that is a bare number (GSM-Plus, MetaMath's released rows) or an int, and one with no number
    assert reward(completions=["#### 2.50", "#### 2.5", "#### 18"], answer=["2.5", "5/2", 18]) == [1.0, 1.0, 1.0]
    assert reward(completions=["#### 3"], answer=["no number"]) == [None]


def test_string_match_training_reward_is_unchanged():
    """The seed's training reward stays narrow: GSM8K's `$18.00` and trailing words still miss."""
    narrow = build_reward({"name": "string_match", "extractor": "last_number", "gold_extractor": "gsm8k",
                           "answer_column": "answer"})
    answers = ["#### $18.00", "Janet makes #### 18 dollars every 2 days.", "so #### 18"]
    assert narrow(completions=answers, answer=[GOLD] * 3) == [0.0, 0.0, 1.0]


@pytest.mark.parametrize(("response", "right"), [
    ("The question does not specify how many apples she had, so it cannot be answered.", True),
    ("We cannot determine the price without knowing the discount. #### 0", True),  # the phrase counts
    ("She had 5 apples and ate 2, so none are missing... #### 3", True),  # the authors' "none" phrase
    ("Let x be the number of apples; she eats 2 of them.", True),  # commits to no final answer
    ("She had 5 apples and ate 2, so #### 3", False),
    ("The answer is \\boxed{3}", False),
])
def test_critical_thinking_items_are_scored_as_gsm_plus_does(response, right):
    """A "None" gold (GSM-Plus critical thinking): right when the response says information is missing
    (the authors' phrases) or gives no final answer, wrong when it commits to one (qtli/GSM-Plus,
    scripts/utils/extract_ans.py, extract_pred_ans_none)."""
    assert says_unanswerable(response) is right
    reward = build_reward({"name": "final_number", "answer_column": "answer"})
    assert reward(completions=[response], answer=["None"]) == [1.0 if right else 0.0]
    assert reward(completions=[response], answer=["The question is flawed.\n#### None"]) == [1.0 if right else 0.0]


def test_gsm_plus_golds_all_read(data_root):
    """Every GSM-Plus testmini gold is a number the scorer reads, or "None" (its 300 critical-thinking rows)."""
    reward = build_reward({"name": "final_number", "answer_column": "answer"})
    rows = read_jsonl(data_root / "gsm_plus" / "testmini.jsonl")
    golds = [reward.gold_answer(row) for row in rows]
    assert None not in golds
    assert sum(g == "none" for g in golds) == 300 == sum(r["perturbation_type"] == "critical thinking" for r in rows)
    # the gold as its own answer scores 1 on every row that has a number
    numbered = [r for r in rows if r["answer"] != "None"]
    assert reward(completions=[f"#### {r['answer']}" for r in numbered], answer=[r["answer"] for r in numbered]) \
        == [1.0] * len(numbered)
