"""Model-written tool calls, executed: the recipe's order of SFT on tool-use traces, then each
agent's GRPO stage from that checkpoint. The built-in 135M model never writes a valid
`<tool_call>` on its own; a short SFT warm-up on traces of the three agents (calculator products,
MBPP tasks checked with `run_tests` in the sandbox, GSM8K problems looked up with `search` in the
duckdb BM25 index) teaches the format. GRPO's tool loop then parses the model's calls, runs them
(the calculator, the sandbox, the index) and feeds the results back as `tool` turns, which the
rollouts show.

Opt-in (slow): on a 2-core CPU the warm-up takes about 8 minutes (32 steps of four traces of
300-530 tokens, at about 15 s a step with two threads; the tools' schemas are in every system
turn). Measured after it (2026-12-02, 48 samples per agent, three prompts none of which was in
the traces, temperature 1.0 and 0.7): calls that parse, 38/48 for the calculator, 32/48 for
search and 19/48 for run_tests (the code inside the JSON string is where a 135M model slips). A
warm-up of 24 steps on 32/12/12 traces made no well-formed coding or search call."""

from __future__ import annotations

import itertools
import json
import re
import statistics

import agent_traces
import example_shards
import pytest
from safetensors.torch import load_file
from train_helpers import run_tiny

from rufus_train.grpo.search_index import build_index, read_corpus

# opt-in and run alone: both cores' threads (one thread made a warm-up step take 37 s, not 20)
pytestmark = pytest.mark.slow
SFT_STEPS = 32
TRACES = 16  # per agent


@pytest.fixture(scope="module")
def warm_start(tmp_path_factory, data_root):
    """One SFT warm-up on the traces of the three agents; the search index is the stage's default corpus."""
    root = tmp_path_factory.mktemp("agents")
    index = build_index(read_corpus(data_root / "gsm8k" / "train.jsonl"), root / "index.duckdb")
    traces = [
        agent_traces.calculator_tool_sft(root / "calculator_sft", limit=TRACES, seed=0),
        agent_traces.coding_tool_sft(data_root, root / "coding_sft", limit=TRACES),
        agent_traces.search_tool_sft(data_root, index, root / "search_sft", limit=TRACES),
    ]
    sft = run_tiny("sft", traces, root / "sft", max_steps=SFT_STEPS, per_device_train_batch_size=4, max_length=640,
                   learning_rate=1e-3, save_steps=SFT_STEPS, max_rows=None)
    losses = [m["loss"] for m in sft.metrics if "loss" in m]
    assert statistics.mean(losses[-8:]) < statistics.mean(losses[:4]) / 2, losses  # the trace format is learnt
    return {"root": root, "sft": sft, "index": index}


def test_sft_on_tool_traces_then_general_agent_executes_model_written_calls(warm_start, tmp_path):
    sft = warm_start["sft"]
    rl_data = agent_traces.calculator_rl(tmp_path / "tool_rl", limit=8, seed=1)  # other products than the SFT ones
    agent = run_tiny(
        "general_agent", rl_data, tmp_path / "agent", model=str(sft.output_dir), tools=["calculator"],
        per_device_train_batch_size=8, num_generations=4, max_completion_length=96, max_rows=None,
        learning_rate=1e-4, temperature=1.0,
    )
    calls = [m["tools/call_frequency"] for m in agent.metrics if "tools/call_frequency" in m]
    failures = [m["tools/failure_frequency"] for m in agent.metrics if "tools/failure_frequency" in m]
    rewards = [m["reward"] for m in agent.metrics if "reward" in m]
    assert calls and max(calls) > 0, f"no completion called a tool: {agent.metrics}"
    assert failures and min(failures) < 1.0, f"every tool call failed: {failures}"
    # three-digit by two-digit products: right only through the calculator's result
    assert max(rewards) > 0, f"no exact product in any group: {agent.metrics}"
    zero_std = [m["frac_reward_zero_std"] for m in agent.metrics if "frac_reward_zero_std" in m]
    assert min(zero_std) < 1.0, f"every group was dead in both steps (2 groups of 4 per step): {zero_std}"
    # the informative group moved the fresh adapter: every lora_B left zero (lora_A moves only in a step
    # after B did, and a second step whose groups all agree has no gradient, so A is not asserted here)
    assert agent.global_step == 2
    saved = load_file(agent.output_dir / "checkpoint-2" / "adapter_model.safetensors")
    lora_b = {name: t for name, t in saved.items() if "lora_B" in name}
    assert lora_b and all(t.abs().max().item() > 0 for t in lora_b.values())


def executed_calls(result, tools: set[str]) -> list[tuple[dict, dict]]:
    """(the model's call, the tool turn that answered it) in the last step's rollouts (TRL keeps
    the conversation of each completion of the last generation batch, tool turns included)."""
    found = []
    for completion in result.trainer._logs["completion"]:
        for turn, reply in itertools.pairwise(completion):
            for call in turn.get("tool_calls") or []:
                if call["function"]["name"] in tools and reply["role"] == "tool":
                    found.append((call["function"], reply))
    return found


def agent_run(stage: str, data, out, warm_start, max_completion_length: int, accumulation: int = 1, **overrides):
    """Two GRPO steps of 8 x `accumulation` samples (groups of 4) from the warmed-up checkpoint;
    temperature 0.7, at which the warm-up's calls parse most often. `max_completion_length` bounds
    the whole exchange (call, tool turn, answer): TRL drops a tool result that would not fit."""
    return run_tiny(stage, data, out, model=str(warm_start["sft"].output_dir), per_device_train_batch_size=8,
                    gradient_accumulation_steps=accumulation, num_generations=4,
                    max_completion_length=max_completion_length, max_rows=None, learning_rate=1e-4, temperature=0.7,
                    **overrides)


def assert_calls_ran(result, tools: set[str]) -> list[tuple[dict, dict]]:
    calls = [m["tools/call_frequency"] for m in result.metrics if "tools/call_frequency" in m]
    failures = [m["tools/failure_frequency"] for m in result.metrics if "tools/failure_frequency" in m]
    assert calls and max(calls) > 0, f"no completion called a tool: {result.metrics}"
    assert min(failures) < 1.0, f"every tool call failed: {failures}"
    ran = executed_calls(result, tools)
    assert ran, f"no {tools} call and result in the last step's rollouts: {list(result.trainer._logs['completion'])[:2]}"
    assert result.global_step == 2
    call, reply = ran[0]
    print(f"\n{result.output_dir.name}: {len(ran)} executed calls in the last step's rollouts, e.g. "
          f"{call['name']}({json.dumps(call['arguments'])[:200]}) -> {reply['content'][:200]!r}")
    return ran


def test_coding_agent_runs_model_written_code_in_the_sandbox(warm_start, data_root, tmp_path):
    """MBPP tasks after the traces' ones: the model's `run_tests`/`run_python` calls run in the
    sandbox against each row's own tests, and the verdict comes back as the tool turn."""
    rl_data = agent_traces.coding_rl(data_root, tmp_path / "coding_rl", limit=8, start=TRACES)
    # 4 prompts a step: about one run_tests call in three parses (the code inside the JSON string is
    # where the model slips), and one step of 8 samples held a single executed call. Accumulated:
    # one micro-batch of 16 sequences of ~560 tokens (the schemas' system turn) took over 24 GB in
    # the loss's forward pass (16 x 560 x 49,152-wide logits, several copies) and was OOM-killed
    result = agent_run("coding_agent", rl_data, tmp_path / "coding_agent", warm_start, max_completion_length=160,
                       accumulation=2)
    ran = assert_calls_ran(result, {"run_tests", "run_python"})
    for call, reply in ran:
        assert isinstance(call["arguments"]["code"], str)
        if call["name"] == "run_tests":  # the row's hidden tests decided, in the sandbox
            assert reply["content"] in ("all tests passed", "some tests failed"), reply


def test_search_agent_searches_the_duckdb_index(warm_start, data_root, tmp_path):
    """GSM8K train problems far from the traces' ones: the model's `search` calls query the BM25
    index (GSM8K train's worked solutions) and the documents found come back as the tool turn."""
    rl_data = example_shards.gsm8k_rl(data_root, tmp_path / "search_rl", limit=8, start=2000, max_chars=300)
    # a hit is a problem with its worked solution (up to about 250 tokens): room for it and the answer
    result = agent_run("search_agent", rl_data, tmp_path / "search_agent", warm_start, max_completion_length=400,
                       search_index=str(warm_start["index"]), search_top_k=1)
    ran = assert_calls_ran(result, {"search"})
    for call, reply in ran:
        query = call["arguments"]["query"]
        assert isinstance(query, str)
        # a hit is `[train-<row>] <problem and worked solution>`, which ends with `#### <number>`
        assert reply["content"] == "no results" or re.match(r"\[train-\d+\] .*#### [\d,.-]+$", reply["content"],
                                                            re.DOTALL), reply
    assert any(reply["content"] != "no results" for _, reply in ran)
