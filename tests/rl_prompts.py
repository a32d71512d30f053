"""RL prompt shard folders for the generation, filter and pairs tests (not a test module).

Single-digit additions are what the built-in 135M model sometimes solves; GSM8K prompts from
$RUFUS_DATA_ROOT it almost never does: together they fill `learnable/` and `all_fail/`."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
from conftest import read_jsonl

from rufus_data.folders.shards import write_shards

# the answer is the last number of the completion, compared with the row's expected_output
NUMBER_REWARD = {"name": "string_match", "extractor": "last_number", "answer_column": "expected_output"}
ADDITIONS = [(1, 1), (2, 3), (4, 5), (5, 4), (6, 2), (3, 4), (2, 2), (7, 1), (1, 2), (3, 5), (4, 4), (6, 3)]


def arithmetic_rows(count: int) -> list[dict]:
    rows = []
    for a, b in ADDITIONS[:count]:
        rows.append(
            {
                "id": f"add-{a}-{b}",
                "source": "generated/addition",
                "label": "arithmetic",
                "prompt": [{"role": "user", "content": f"What is {a} + {b}? Answer with just the number."}],
                "expected_output": str(a + b),
                "solution": f"{a} + {b} = {a + b}. The answer is {a + b}.",
            }
        )
    return rows


def gsm8k_rows(data_root: Path, count: int) -> list[dict]:
    rows = []
    for index, record in enumerate(read_jsonl(data_root / "gsm8k" / "test.jsonl", limit=count)):
        rows.append(
            {
                "id": f"gsm8k-test-{index}",
                "source": "gsm8k",
                "label": "math",
                "prompt": [{"role": "user", "content": record["question"]}],
                "expected_output": record["answer"].rsplit("####", 1)[1].strip(),
                "solution": record["answer"],
            }
        )
    return rows


def write_rl_shards(folder: Path, rows: list[dict]) -> Path:
    write_shards(pa.Table.from_pylist(rows), folder)
    return folder
