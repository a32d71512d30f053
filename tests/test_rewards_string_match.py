"""String-match reward, extractors, normalisation, None rules and <think> handling, on real data."""

from __future__ import annotations

import multiprocessing
import pickle
import re
import warnings

import pytest
from conftest import read_jsonl

from rufus_data.base.errors import RufusError
from rufus_data.rewards import (
    REWARDS,
    CodeExecutionReward,
    IFEvalReward,
    LLMJudgeReward,
    MathEquivalenceReward,
    OverlongPenalty,
    StringMatchReward,
    build_reward,
    build_rewards,
    extract_boxed,
    extract_gsm8k,
    extract_last_number,
    normalise_answer,
    split_reasoning,
    strip_reasoning,
)


class Metrics:
    def __init__(self):
        self.values = {}

    def __call__(self, name, value):
        self.values[name] = self.values.get(name, 0.0) + value


# ------------------------------------------------------------------ extractors


def test_boxed_edge_cases():
    assert extract_boxed(r"so \boxed{\frac{1}{2}}.") == r"\frac{1}{2}"
    assert extract_boxed(r"\boxed{\sqrt{\frac{a}{b^{2}}}} done") == r"\sqrt{\frac{a}{b^{2}}}"
    assert extract_boxed("no box here, answer 5") is None
    assert extract_boxed(r"first \boxed{3}, then corrected: \boxed{4}") == "4"
    assert extract_boxed(r"\boxed {7}") == "7"
    assert extract_boxed(r"\boxed{unclosed {") is None
    # the last box is truncated: no answer, not the earlier closed box (the model was replacing it)
    assert extract_boxed(r"\boxed{2} and a broken \boxed{3") is None
    assert extract_boxed(r"\fbox{2} then \boxed{\frac{1}{2}") is None
    assert extract_boxed(r"\boxed{2}, and the \boxed command") == "2"  # a bare mention is not a box
    assert extract_boxed(r"\fbox{9}") == "9"
    reward = StringMatchReward("boxed")
    assert reward(completions=[r"\boxed{5} then truncated \boxed{6", r"\boxed{5}"], solution=["5", "5"]) == [0.0, 1.0]


def test_gsm8k_and_last_number_edge_cases():
    assert extract_gsm8k("work...\n#### 1,234") == "1,234"
    assert extract_gsm8k("#### 1\n#### -72\n") == "-72"
    assert extract_gsm8k("no marker") is None
    assert extract_gsm8k("####   ") is None
    assert extract_last_number("it costs -3.5 dollars") == "-3.5"
    assert extract_last_number("total 1,234 apples") == "1,234"
    assert extract_last_number("was 12, now 7.") == "7"
    assert extract_last_number("from 3 to 10.25 m") == "10.25"
    assert extract_last_number("no digits") is None
    # a sign only where it cannot be a hyphen or an operator between numbers
    assert extract_last_number("-5") == "-5"
    assert extract_last_number("x = -3.5") == "-3.5"
    assert extract_last_number("(-7)") == "-7"
    assert extract_last_number("the 2023-2024 season") == "2024"
    assert extract_last_number("pages 10-12") == "12"
    assert extract_last_number("3.5-1.5") == "1.5"
    # comma-joined digits are one token: never read "3,50" as 50
    assert extract_last_number("it costs 3,50 euros") == "3,50"
    assert extract_last_number("1,234") == "1,234"
    reward = StringMatchReward("last_number", answer_column="answer")
    assert reward(completions=["the 2023-2024 season", "3,50", "total: 1,234."], answer=["2024", "50", "1234"]) == [1.0, 0.0, 1.0]


def test_integer_comparison_and_gold_extractor_options(data_root):
    """AIME golds compare as integers ("025" == 25); GSM8K's worked gold answers are read after `####`
    while the completions give their last number; both through the registry, as the suites name them."""
    aime = build_reward({"name": "string_match", "extractor": "boxed", "compare": "integer", "answer_column": "answer"})
    answers = ["so \\boxed{25}", "\\boxed{025}", "\\boxed{24}", "no box", "\\boxed{25.0}", "\\boxed{2.5}"]
    assert aime(completions=answers, answer=["025"] * 6) == [1.0, 1.0, 0.0, 0.0, 1.0, 0.0]
    assert aime(completions=["\\boxed{25}"], answer=["twenty-five"]) == [None]  # no integer gold: unscored
    assert StringMatchReward("boxed")(completions=["\\boxed{25}"], solution=["025"]) == [0.0]  # strings differ
    rows = read_jsonl(data_root / "gsm8k" / "test.jsonl", limit=20)
    golds = [row["answer"] for row in rows]
    finals = [extract_gsm8k(gold) for gold in golds]
    gsm8k = build_reward({"name": "string_match", "extractor": "last_number", "gold_extractor": "gsm8k",
                          "answer_column": "answer"})
    assert gsm8k(completions=[f"So the answer is {final}." for final in finals], answer=golds) == [1.0] * 20
    # and the gold is the `####` answer, not the last number of the worked text: off by one scores 0.0
    wrong = [f"The answer is {int(final.replace(',', '')) + 1}" for final in finals]
    assert gsm8k(completions=wrong, answer=golds) == [0.0] * 20
    with pytest.raises(RufusError, match="compare must be one of string, integer"):
        build_reward({"name": "string_match", "compare": "float"})
    with pytest.raises(RufusError, match="unknown extractor 'hash'"):
        build_reward({"name": "string_match", "gold_extractor": "hash"})


def test_normalisation_list():
    assert normalise_answer("  1,234 ") == "1234"
    assert normalise_answer("$5$") == "5"
    assert normalise_answer(r"\$5") == "5"
    assert normalise_answer(r"\$5\$") == "5"
    assert normalise_answer("$5") == "5"  # a currency amount (GSM8K style)
    assert normalise_answer("5$") == "5"  # symmetric: a math delimiter cut in half
    assert normalise_answer(r"5\$") == "5"
    assert normalise_answer(r"$\frac{1}{2}$.") == r"\frac{1}{2}"
    assert normalise_answer("{7}") == "7"
    assert normalise_answer("42.") == "42"
    assert normalise_answer("The   Answer\nIs  X") == "the answer is x"
    assert normalise_answer(r"{\frac{1}{2}}") == r"\frac{1}{2}"
    assert normalise_answer(r"{1}{2}") == "{1}{2}"  # not one surrounding group
    assert normalise_answer("3.50") == "3.50"  # no numeric canonicalisation: that is math_equivalence's job
    assert normalise_answer("1,2") == "1,2"  # a list, not a thousands separator


def test_think_rule_is_one_function():
    assert strip_reasoning("<think>\\boxed{1}</think> \\boxed{2}") == (" \\boxed{2}", True)
    assert strip_reasoning("<think>still thinking \\boxed{1}") == ("", False)
    assert strip_reasoning("plain \\boxed{3}") == ("plain \\boxed{3}", True)
    assert strip_reasoning("prompt opened it</think>\\boxed{4}") == ("\\boxed{4}", True)
    assert split_reasoning("<think> r </think>a")[0] == "r"
    # a second <think> opened after the last </think> never closes: no answer
    assert strip_reasoning("<think>a</think> ok <think>\\boxed{5}") == ("", False)
    assert split_reasoning("<think>a</think> ok <think> more")[0] == "more"
    assert strip_reasoning("<think>a</think><think>b</think> \\boxed{5}") == (" \\boxed{5}", True)
    reward = StringMatchReward("boxed")
    metrics = Metrics()
    assert reward(completions=["<think>a</think> ok <think>\\boxed{5}"], solution=["5"], log_metric=metrics) == [0.0]
    assert metrics.values["string_match_boxed/unclosed_think"] == 1.0


# ------------------------------------------------------------------ string-match reward and None rules


def test_string_match_scores_and_none_rules():
    reward = StringMatchReward("boxed")
    metrics = Metrics()
    scores = reward(
        prompts=["q"] * 7,
        completions=[
            r"\boxed{5}",
            r"\boxed{5}",
            r"\boxed{6}",
            r"<think>\boxed{5}</think> so the answer is \boxed{5}.",
            r"<think>I think \boxed{5}",  # never closes: no answer, 0.0 and counted
            r"\boxed{5}",
            r"\boxed{1,000}",
        ],
        completion_ids=[[1]] * 7,
        solution=[r"The answer is $\boxed{5}$.", None, "5", "5", "5", "   ", r"\$1000"],
        trainer_state=None,
        log_metric=metrics,
        log_extra=lambda *a: None,
    )
    assert scores == [1.0, None, 0.0, 1.0, 0.0, None, 1.0]
    assert metrics.values["string_match_boxed/unclosed_think"] == 1.0
    assert metrics.values["string_match_boxed/unscored"] == 2.0
    # of the 5 scored completions, one (the unclosed <think>) holds no \boxed{} answer
    assert metrics.values["string_match_boxed/unparsed"] == pytest.approx(0.2)
    never = Metrics()
    assert reward(completions=["5", "it is 5"], solution=["5", "5"], log_metric=never) == [0.0, 0.0]
    assert never.values["string_match_boxed/unparsed"] == 1.0  # the extractor read no answer at all


def test_unclosed_think_counts_only_scored_rows():
    reward = StringMatchReward("boxed", only_label="math")
    metrics = Metrics()
    unclosed = r"<think>\boxed{5}"
    scores = reward(completions=[unclosed] * 4, solution=["5", "5", None, "5"], label=["math", "code", "math", "math"],
                    log_metric=metrics)
    assert scores == [0.0, None, None, 0.0]  # other label, missing gold: not scored, so not counted
    assert metrics.values["string_match_boxed/unclosed_think"] == 2.0


def test_missing_answer_column_warns_once():
    for reward in (StringMatchReward("boxed", answer_column="answer"), MathEquivalenceReward(answer_column="answer")):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert reward(completions=[r"\boxed{5}"] * 2, solution=["5", "5"]) == [None, None]
            assert reward(completions=[r"\boxed{5}"], solution=["5"]) == [None]
            assert reward(completions=[r"\boxed{5}"], answer=["5"]) == [1.0]
        messages = [str(w.message) for w in caught]
        assert sum("'answer' column" in m for m in messages) == 1, messages


def test_only_label_rules():
    reward = StringMatchReward("gsm8k", only_label="math")
    scores = reward(completions=["#### 3", "#### 3", "#### 4"], solution=["#### 3"] * 3, label=["math", "code", "math"])
    assert scores == [1.0, None, 0.0]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert reward(completions=["#### 3", "#### 3"], solution=["3", "3"]) == [None, None]
        assert reward(completions=["#### 3"], solution=["3"]) == [None]
    assert sum("no 'label' column" in str(w.message) for w in caught) == 1  # warned once


def test_conversational_completions():
    reward = StringMatchReward("last_number", answer_column="answer")
    completions = [[{"role": "assistant", "content": "It is 12."}], [{"role": "assistant", "content": "<think>12"}]]
    assert reward(completions=completions, answer=["12", "12"]) == [1.0, 0.0]


# ------------------------------------------------------------------ real data


def test_gsm8k_train_every_answer(data_root):
    rows = read_jsonl(data_root / "gsm8k" / "train.jsonl")
    assert len(rows) == 7473
    golds = [row["answer"].rsplit("####", 1)[1].strip() for row in rows]
    assert [extract_gsm8k(row["answer"]) for row in rows] == golds
    reward = StringMatchReward("gsm8k", answer_column="answer")
    completions = [row["answer"] for row in rows]
    assert reward(completions=completions, answer=completions) == [1.0] * len(rows)

    def change_final_number(text):
        head, tail = text.rsplit("####", 1)
        number = extract_last_number(tail)
        changed = str(int(number.replace(",", "")) + 1) if re.fullmatch(r"-?[\d,]+", number) else number + "1"
        return f"{head}#### {changed}"

    changed = [change_final_number(text) for text in completions]
    assert reward(completions=changed, answer=completions) == [0.0] * len(rows)
    # independent cross-check: the last number of the worked solution vs the #### answer
    agree = sum(
        normalise_answer(extract_last_number(row["answer"].rsplit("####", 1)[0]) or "") == normalise_answer(gold)
        for row, gold in zip(rows, golds)
    )
    share = agree / len(rows)
    print(f"last_number on worked solution agrees with #### on {agree}/{len(rows)} = {share:.2%}")
    assert share > 0.94  # measured 94.90% (7,092 rows); disagreements: units/rounding/final step in prose


def test_math500_boxed_solution_equals_answer(data_root):
    rows = read_jsonl(data_root / "math500" / "test.jsonl")
    assert len(rows) == 500
    misses = [row["unique_id"] for row in rows if normalise_answer(extract_boxed(row["solution"]) or "") != normalise_answer(row["answer"])]
    assert len(misses) <= 5, misses  # >= 99%; measured 0 misses (see docs/rewards.md)
    reward = StringMatchReward("boxed", answer_column="answer")
    assert reward(completions=[row["solution"] for row in rows], answer=[row["answer"] for row in rows]).count(1.0) >= 495


def test_math500_completions_written_like_a_model(data_root):
    rows = {row["unique_id"]: row for row in read_jsonl(data_root / "math500" / "test.jsonl")}
    row = rows["test/precalculus/807.json"]
    gold = row["answer"]
    reward = StringMatchReward("boxed", answer_column="answer")
    cases = {
        # reasoning block holding a wrong box, the final box correct, trailing prose
        f"<think>Maybe \\boxed{{0}}? No.</think>Therefore the answer is $\\boxed{{{gold}}}$. Hope this helps!": 1.0,
        # several boxes: the last one counts (a model that corrects itself)
        f"First guess \\boxed{{0}}. Wait, recheck. Final: \\boxed{{{gold}}}": 1.0,
        f"Final: \\boxed{{{gold}}} (earlier I wrote \\boxed{{0}})": 0.0,  # the last box is the wrong one
        f"The answer is {gold}.": 0.0,  # no box, no answer for the boxed extractor
        f"<think>The answer is \\boxed{{{gold}}}": 0.0,  # unclosed reasoning
        f"\\boxed{{{{{gold}}}}}": 1.0,  # extra surrounding braces
    }
    scores = reward(completions=list(cases), answer=[gold] * len(cases))
    assert scores == list(cases.values())


# ------------------------------------------------------------------ picklable, usable in a spawned process


def _call_in_child(payload):
    reward, kwargs = pickle.loads(payload)
    import asyncio
    import inspect

    out = reward(**kwargs)
    return asyncio.run(out) if inspect.isawaitable(out) else out


@pytest.mark.spawn
def test_every_reward_pickles_and_runs_in_a_spawned_process(openai_stub):
    from test_rewards_llm_judge import ScriptedJudge

    judge = ScriptedJudge(openai_stub)  # a real OpenAI-compatible server on 127.0.0.1: the child takes the HTTP path
    rewards = [
        (StringMatchReward("boxed"), {"completions": [r"\boxed{2}"], "solution": ["2"]}, [1.0]),
        (MathEquivalenceReward(), {"completions": [r"\boxed{0.5}"], "solution": [r"\frac{1}{2}"]}, [1.0]),
        (IFEvalReward(), {"prompts": ["x"], "completions": ["hello world"],
                               "instruction_id_list": [["change_case:english_lowercase"]], "kwargs": [[{}]]}, [1.0]),
        (CodeExecutionReward(workers=1), {"completions": ["def f():\n    return 1"],
                                                 "test_list": [["assert f() == 1"]]}, [1.0]),
        (OverlongPenalty(max_length=10, cache=4), {"completions": ["a"], "completion_ids": [[1] * 8]}, [-0.5]),
        (LLMJudgeReward(base_url=judge.url, timeout_s=10),
         {"prompts": ["q", "q"], "completions": ["[[case:score8]]", "[[case:score3]]"], "solution": ["b", "b"]}, [1.0, 0.0]),
    ]
    context = multiprocessing.get_context("spawn")
    with context.Pool(1) as pool:
        for reward, kwargs, expected in rewards:
            assert pool.apply(_call_in_child, (pickle.dumps((reward, kwargs)),)) == expected, reward
    assert judge.attempts == {"score8": 1, "score3": 1}  # the child's requests reached the server


# ------------------------------------------------------------------ registry


def test_registry_specs():
    reward = build_reward("string_match:boxed")
    assert (reward.extractor, reward.only_label) == ("boxed", None)
    reward = build_reward({"name": "string_match", "extractor": "gsm8k", "only_label": "math"})
    assert (reward.extractor, reward.only_label) == ("gsm8k", "math")
    funcs, weights = build_rewards(["string_match:boxed", {"name": "overlong_penalty", "max_length": 64, "cache": 16, "weight": 0.5}])
    assert [f.__name__ for f in funcs] == ["string_match_boxed", "overlong_penalty"] and weights == [1.0, 0.5]
    assert build_reward("ifeval:loose").mode == "loose"
    judge = build_reward({"name": "llm_judge", "threshold": 8, "reference_column": "gold", "only_label": "chat"})
    assert (judge.threshold, judge.reference_column, judge.concurrency) == (8, "gold", 16)
    assert build_reward({"name": "code_execution", "workers": 4, "pass_fraction": True}).workers == 4
    for bad in ("nope", "string_match:nope", {"extractor": "boxed"}, {"name": "string_match", "extractr": "boxed"}, 3):
        with pytest.raises(RufusError):
            build_reward(bad)


def test_registry_parameters_are_the_class_signature():
    """One table of names; a spec's keys are checked against the reward class's own __init__."""
    assert REWARDS["math_equivalence"] is MathEquivalenceReward
    assert build_reward({"name": "math_equivalence", "timeout_s": 3}).timeout_s == 3  # a class-only parameter
    assert build_reward("math_equivalence:gold").answer_column == "gold"  # the positional is the first parameter
    with pytest.raises(RufusError, match=r"has no parameter\(s\) \['timeout'\].*allowed: answer_column, only_label"):
        build_reward({"name": "math_equivalence", "timeout": 3})
    with pytest.raises(RufusError, match=r"'overlong_penalty' needs parameter\(s\) \['cache'\]"):
        build_reward({"name": "overlong_penalty", "max_length": 64})
    with pytest.raises(RufusError, match="unknown reward 'nope'.*use one of string_match, math_equivalence"):
        build_reward("nope:x")
