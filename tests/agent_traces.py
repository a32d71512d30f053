"""Tool-use traces and prompts for the agent stages: the recipe's order is SFT on traces first
(a model that never writes a `<tool_call>` gives GRPO's tool loop nothing to run), then agent RL.

Each trace is a conversation in which the assistant calls a tool, reads the `tool` turn and
answers; the `tools` column holds the JSON schemas, so SFTTrainer renders them into the system
turn exactly as GRPO's tool loop will and the format learnt is the one parsed there. The tool
turns are the real tools' output, executed while the traces are built.

- calculator (general_agent): 3-digit by 2-digit products, beyond a 135M model's mental arithmetic;
- coding (coding_agent): MBPP tasks (never its test split) solved with `run_tests` on the
  reference solution, in the sandbox, then the code in the answer;
- search (search_agent): GSM8K train problems looked up in the default corpus (GSM8K train's
  worked solutions, BM25 in duckdb), then the final number."""

from __future__ import annotations

import json
import random
from pathlib import Path

from example_shards import gsm8k_final, gsm8k_rows, write_rows

from rufus_data.base.jsonl import read_jsonl
from rufus_train.grpo.tools import CodingEnvironment, SearchEnvironment, calculator

# MBPP's test split (task ids 11-510) and task 569 (its text repeats test task 104) never enter
# (as catalogs/data/mbpp_prompts.yaml keeps them out).
MBPP_EVAL_IDS = (range(11, 511), range(569, 570))


def tool_schemas(*functions) -> str:
    """The JSON schemas transformers derives from the tools' type hints and docstrings, as GRPO shows them."""
    from transformers.utils import get_json_schema  # heavy: only for the tool-use traces

    return json.dumps([get_json_schema(f) for f in functions])


def tool_call(name: str, **arguments) -> dict:
    return {"type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}


def trace(question: str, call: dict, result: str, answer: str) -> list[dict]:
    """user -> assistant tool call -> tool result -> assistant answer (`tool_calls` on every turn: one schema)."""
    return [
        {"role": "user", "content": question, "tool_calls": None},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "content": result, "tool_calls": None},
        {"role": "assistant", "content": answer, "tool_calls": None},
    ]


# ------------------------------------------------------------------------------ calculator


def _products(count: int, seed: int) -> list[tuple[int, int]]:
    rng = random.Random(seed)
    return [(rng.randint(101, 999), rng.randint(11, 99)) for _ in range(count)]


def calculator_tool_sft(out: Path, limit: int = 32, seed: int = 0) -> Path:
    """The user asks a product, the assistant calls `calculator`, reads the result and answers."""
    tools = tool_schemas(calculator)
    rows = []
    for a, b in _products(limit, seed):
        expression = f"{a} * {b}"
        rows.append({
            "id": f"calc-{seed}-{a}x{b}", "source": "generated/calculator", "label": "tool_use", "tools": tools,
            "messages": trace(f"What is {expression}?", tool_call("calculator", expression=expression),
                              calculator(expression), f"{expression} = {a * b}. The answer is {a * b}."),
        })
    return write_rows(out, rows, "sft", "generated: calculator tool-use traces")


def calculator_rl(out: Path, limit: int = 16, seed: int = 1) -> Path:
    """Product prompts for the general_agent stage; `expected_output` is the exact product."""
    rows = [{"id": f"calc-{seed}-{a}x{b}", "source": "generated/calculator", "label": "tool_use",
             "prompt": [{"role": "user", "content": f"What is {a} * {b}?"}], "expected_output": str(a * b)}
            for a, b in _products(limit, seed)]
    return write_rows(out, rows, "rl", "generated: calculator prompts")


# ------------------------------------------------------------------------------ coding (MBPP)


def mbpp_tasks(data_root: Path, start: int, limit: int, max_code_chars: int = 160) -> list[dict]:
    """MBPP tasks outside its test split whose reference solution is short, in file order from `start`."""
    rows = [r for r in read_jsonl(Path(data_root) / "mbpp_sanitized" / "sanitized-mbpp.jsonl")
            if not any(r["task_id"] in ids for ids in MBPP_EVAL_IDS) and len(r["code"]) <= max_code_chars]
    return rows[start:start + limit]


def mbpp_question(task: dict) -> str:
    """The task and its first test, as the bigcode harness (and the mbpp_task_prompts builder) prompt MBPP."""
    return f"{task['prompt'].strip()}\n{task['test_list'][0]}"


def coding_tool_sft(data_root: Path, out: Path, limit: int = 16, start: int = 0) -> Path:
    """The assistant checks the reference solution with `run_tests` (run in the sandbox against the
    task's tests), reads the verdict, and answers with the code."""
    probe = CodingEnvironment()
    tools = tool_schemas(probe.run_python, probe.run_tests)
    rows = []
    for task in mbpp_tasks(data_root, start, limit):
        code = task["code"].strip().replace("\r\n", "\n")
        env = CodingEnvironment()
        env.reset(test_list=task["test_list"], test_imports=task["test_imports"])
        rows.append({
            "id": f"mbpp-{task['task_id']}", "source": "mbpp", "label": "tool_use", "tools": tools,
            "messages": trace(mbpp_question(task), tool_call("run_tests", code=code), env.run_tests(code),
                              f"```python\n{code}\n```"),
        })
    return write_rows(out, rows, "sft", "mbpp_sanitized/sanitized-mbpp.jsonl: tool-use traces")


def coding_rl(data_root: Path, out: Path, limit: int = 8, start: int = 0) -> Path:
    """MBPP prompts with their tests (what the code_execution reward and run_tests read)."""
    rows = [{"id": f"mbpp-{t['task_id']}", "source": "mbpp", "label": "code",
             "prompt": [{"role": "user", "content": mbpp_question(t)}], "expected_output": None,
             "test_list": t["test_list"], "test_imports": t["test_imports"]}
            for t in mbpp_tasks(data_root, start, limit)]
    return write_rows(out, rows, "rl", "mbpp_sanitized/sanitized-mbpp.jsonl")


# ------------------------------------------------------------------------------ search (GSM8K)


def search_tool_sft(data_root: Path, index_path: Path, out: Path, limit: int = 16, start: int = 0, top_k: int = 1,
                    max_chars: int | None = 300) -> Path:
    """The assistant searches the corpus with the question, reads what the index returns (the
    problem's worked solution, found by BM25), and answers with its final number."""
    env = SearchEnvironment(str(index_path), top_k)
    tools = tool_schemas(env.search)
    rows = []
    for row in gsm8k_rows(data_root, "train", start, limit, max_chars):
        final = gsm8k_final(row["answer"])
        rows.append({
            "id": f"gsm8k-{row['_index']}", "source": "gsm8k", "label": "tool_use", "tools": tools,
            "messages": trace(row["question"], tool_call("search", query=row["question"]), env.search(row["question"]),
                              f"The answer is {final}."),
        })
    return write_rows(out, rows, "sft", "gsm8k/train.jsonl: search tool-use traces")
