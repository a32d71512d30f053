"""Learnability buckets, GRPO advantages (checked against TRL's own formula), overlong penalty, response parsing."""

from __future__ import annotations

import math

import pytest
import torch

from rufus_data.base.errors import RufusError
from rufus_data.rewards import (
    OverlongPenalty,
    add_response_fields,
    add_response_schema,
    combine_rewards,
    group_outcomes,
    group_signal,
    grpo_advantages,
    overlong_penalty,
    parse_response,
)


def test_group_outcomes_buckets():
    rewards = [1.0, 0.0, 1.0, 1.0] + [1.0] * 4 + [0.0] * 4 + [0.5] * 4 + [None] * 4 + [None, 1.0, None, 1.0]
    outcomes = group_outcomes(rewards, k=4)
    assert [o.outcome for o in outcomes] == ["learnable", "all_pass", "all_fail", "constant", "unscored", "all_pass"]
    assert outcomes[0].p == 0.75 and outcomes[4].p is None and outcomes[5].scored == 2
    assert group_outcomes([2.0, 2.0], k=2, max_reward=2.0)[0].outcome == "all_pass"
    with pytest.raises(RufusError):
        group_outcomes([1.0] * 5, k=4)


def test_group_outcomes_combines_several_functions_like_trl():
    correctness = [1.0, 1.0, None, 0.0]
    penalty = [0.0, -0.5, None, None]
    assert combine_rewards([correctness, penalty], weights=[1.0, 2.0]) == [1.0, 0.0, None, 0.0]
    outcomes = group_outcomes([correctness, penalty], k=2, weights=[1.0, 2.0])
    assert [o.outcome for o in outcomes] == ["learnable", "all_fail"]


def test_group_signal_is_what_trl_takes_advantages_from():
    """normalize_then_sum as TRL's GRPOTrainer computes it: each reward normalised in the group,
    weighted, nansummed; a completion no reward scored stays unscored (None), never 0."""
    from trl.trainer.utils import nanstd

    per_function = [[1.0, 0.0, None, 0.5], [0.2, None, None, 0.9], [None, 3.0, None, None]]
    weights = [1.0, 2.0, 0.5]
    grouped = torch.tensor([[math.nan if r is None else r for r in f] for f in per_function]).T.unsqueeze(0)
    mean = torch.nanmean(grouped, dim=1, keepdim=True)
    normalised = (grouped - mean) / (nanstd(grouped, dim=1, keepdim=True) + 1e-4)
    trl = (normalised * torch.tensor(weights)).nansum(dim=2).flatten().tolist()
    ours = group_signal(per_function, weights, "normalize_then_sum")
    assert ours[2] is None and torch.isnan(grouped[0, 2]).all()
    assert [o for i, o in enumerate(ours) if i != 2] == pytest.approx([v for i, v in enumerate(trl) if i != 2], abs=1e-5)
    assert group_signal(per_function, weights) == combine_rewards(per_function, weights)
    with pytest.raises(RufusError, match="aggregation must be one of"):
        group_signal(per_function, weights, "sum")


def test_grpo_advantages_match_trl_formula():
    from trl.trainer.utils import nanstd

    rewards = [1.0, 0.0, 0.0, 1.0, 0.5, 0.5, 0.5, 0.5, 1.0, None, 0.0, 0.0]
    ours = grpo_advantages(rewards, k=4)
    tensor = torch.tensor([math.nan if r is None else r for r in rewards]).view(-1, 4)
    mean = torch.nanmean(tensor, dim=1, keepdim=True)
    std = nanstd(tensor, dim=1).view(-1, 1)
    trl = ((tensor - mean) / (std + 1e-4)).flatten().tolist()
    for mine, theirs, reward in zip(ours, trl, rewards):
        if reward is None:
            assert mine == 0.0  # TRL forces unscorable completions to 0
        else:
            assert mine == pytest.approx(theirs, abs=1e-6)
    assert grpo_advantages([0.5] * 4, k=4) == [0.0] * 4
    assert grpo_advantages([1.0, 0.0], k=2, scale=False) == [0.5, -0.5]


def test_overlong_penalty_dapo_shape():
    assert overlong_penalty(60, max_length=100, cache=20) == 0.0
    assert overlong_penalty(80, max_length=100, cache=20) == 0.0
    assert overlong_penalty(90, max_length=100, cache=20) == pytest.approx(-0.5)
    assert overlong_penalty(100, max_length=100, cache=20) == -1.0
    assert overlong_penalty(130, max_length=100, cache=20) == -1.0
    reward = OverlongPenalty(max_length=100, cache=20)
    assert reward(completions=["a", "b"], completion_ids=[[0] * 10, [0] * 95]) == [0.0, pytest.approx(-0.75)]
    with pytest.raises(RufusError):
        OverlongPenalty(max_length=10, cache=20)


def test_parse_response_reasoning_content_tool_calls():
    text = (
        "<think>need the weather</think>Let me check.\n"
        '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>\n'
        '<tool_call>{"name": "broken", "arguments": {</tool_call>\n'
        '<tool_call>{"name": "as_string", "arguments": "{\\"x\\": 1}"}</tool_call>'
    )
    parsed = parse_response(text)
    assert parsed.reasoning == "need the weather"
    assert parsed.content == "Let me check."
    assert parsed.tool_calls == [
        {"name": "get_weather", "arguments": {"city": "Paris"}},
        {"name": "as_string", "arguments": {"x": 1}},
    ]
    assert len(parsed.errors) == 1 and "tool_call 1: invalid JSON" in parsed.errors[0]
    unclosed = parse_response([{"role": "assistant", "content": "<think>hmm <tool_call>{}"}])
    assert unclosed.reasoning_closed is False and unclosed.content == "" and unclosed.errors
    row = add_response_fields({"id": "a", "completion": "plain answer"})
    assert row["content"] == "plain answer" and row["reasoning"] is None and row["tool_calls"] == []


def test_add_response_schema_lets_the_builtin_tokenizer_parse_its_own_template(tiny_tokenizer):
    """Round trip: render an assistant turn with the Rufus template, parse it back with transformers."""
    tokenizer = add_response_schema(tiny_tokenizer)
    message = {
        "role": "assistant",
        "reasoning_content": "look it up",
        "content": "Checking.",
        "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}],
    }
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
    full = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}, message], tokenize=False)
    assert full.startswith(prompt)
    generated = full[len(prompt):]
    parsed = tokenizer.parse_response(generated, prefix=prompt)
    assert parsed["reasoning_content"] == "look it up" and parsed["content"].strip() == "Checking."
    assert parsed["tool_calls"] == message["tool_calls"]
    ours = parse_response(generated)
    assert (ours.reasoning, ours.content, ours.tool_calls) == (
        "look it up", "Checking.", [{"name": "get_weather", "arguments": {"city": "Paris"}}])
