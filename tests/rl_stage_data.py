"""Shard folders and rewards for the GRPO tests (not a test module).

Real rows from $RUFUS_DATA_ROOT (GSM8K, MBPP, HumanEval, IFEval) mixed with easy generated
prompts the built-in 135M model sometimes gets right, so rewards vary inside groups (a batch
where every group is dead trains nothing and proves nothing)."""

from __future__ import annotations

import json
from pathlib import Path

from conftest import read_jsonl
from rl_prompts import arithmetic_rows, gsm8k_rows, write_rl_shards

# Easy generated coding tasks with MBPP-style asserts: the 135M model writes some of them.
EASY_CODE = [
    ("add", "a, b", "a + b", ["assert add(2, 3) == 5", "assert add(0, 0) == 0"]),
    ("double", "x", "2 * x", ["assert double(4) == 8", "assert double(0) == 0"]),
    ("square", "x", "x * x", ["assert square(3) == 9", "assert square(1) == 1"]),
    ("is_even", "n", "n % 2 == 0", ["assert is_even(4) is True", "assert is_even(3) is False"]),
]


def easy_code_rows() -> list[dict]:
    rows = []
    for name, args, _, tests in EASY_CODE:
        rows.append(
            {
                "id": f"easy-code-{name}",
                "source": "generated/code",
                "label": "code",
                "prompt": [{"role": "user", "content": f"Write a Python function {name}({args}). Reply with only the code."}],
                "expected_output": None,
                "test_list": tests,
                "test": None,
                "entry_point": None,
            }
        )
    return rows


def mbpp_rows(data_root: Path, count: int) -> list[dict]:
    rows = []
    for record in read_jsonl(data_root / "mbpp_sanitized" / "sanitized-mbpp.jsonl", limit=count):
        rows.append(
            {
                "id": f"mbpp-{record['task_id']}",
                "source": "mbpp",
                "label": "code",
                "prompt": [{"role": "user", "content": f"{record['prompt']}\n{record['test_list'][0]}"}],
                "expected_output": None,
                "test_list": record["test_list"],
                "test": None,
                "entry_point": None,
            }
        )
    return rows


def humaneval_rows(data_root: Path, count: int) -> list[dict]:
    rows = []
    for record in read_jsonl(data_root / "humaneval" / "HumanEval.jsonl", limit=count):
        rows.append(
            {
                "id": record["task_id"].replace("/", "-"),
                "source": "humaneval",
                "label": "code",
                "prompt": [{"role": "user", "content": f"Complete this function:\n{record['prompt']}"}],
                "expected_output": None,
                "test_list": None,
                "test": record["test"],
                "entry_point": record["entry_point"],
            }
        )
    return rows


def ifeval_rows(data_root: Path, count: int) -> list[dict]:
    """Short IFEval prompts (their verifiers decide the reward)."""
    rows = []
    for record in read_jsonl(data_root / "ifeval" / "input_data.jsonl"):
        if len(record["prompt"]) > 220:
            continue
        rows.append(
            {
                "id": f"ifeval-{record['key']}",
                "source": "ifeval",
                "label": "instruction",
                "prompt": [{"role": "user", "content": record["prompt"]}],
                "expected_output": None,
                "instruction_id_list": record["instruction_id_list"],
                "kwargs": json.dumps(record["kwargs"]),
            }
        )
        if len(rows) >= count:
            break
    return rows


def search_corpus(path: Path) -> Path:
    """A tiny local corpus for the search agent (one fact per addition it is asked about)."""
    documents = [{"id": f"fact-{i}", "text": f"The sum of {a} and {b} is {a + b}."}
                 for i, (a, b) in enumerate([(1, 1), (2, 3), (4, 5), (5, 4), (6, 2), (3, 4)])]
    documents.append({"id": "paris", "text": "Paris is the capital of France."})
    path.write_text("".join(json.dumps(d) + "\n" for d in documents))
    return path


__all__ = [
    "arithmetic_rows", "easy_code_rows", "gsm8k_rows", "humaneval_rows", "ifeval_rows", "mbpp_rows",
    "search_corpus", "write_rl_shards",
]
