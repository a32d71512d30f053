"""Small shard folders built from the raw public files under $RUFUS_DATA_ROOT (GSM8K, Code
Alpaca, MBPP, IFEval): real rows for the tests and the benches, so all of them run offline. Each
builder writes canonical rows (see rufus_data/folders/shards.py) with `write_shards` and returns the
folder; the agent stages' tool-use traces are in agent_traces.py. Test fixtures, not product:
the benches that need them put this folder on sys.path.

    sft          messages = [user question, assistant worked answer]
    preference   prompt / chosen (gold answer) / rejected (the same answer, final number changed)
    kto          prompt / completion / desirable (bool, its own column; `label` stays the source's)
    rl           prompt = [user question], expected_output = final number

The rejected answers are `rufus-data pairs`' perturbation (`perturb_final_answer`), seeded per row.
"""

from __future__ import annotations

import random
import re
from itertools import islice
from pathlib import Path

import pyarrow as pa

from rufus_data.base.errors import RufusError
from rufus_data.base.jsonl import read_jsonl
from rufus_data.folders.shards import write_manifest, write_shards
from rufus_data.rewards.extract import extract_gsm8k
from rufus_data.sources.perturb import perturb_final_answer


def _read_rows(path: Path, start: int, limit: int) -> list[dict]:
    """Rows `start` to `start + limit` of a JSONL file, each with its row number as `_index`."""
    return [{**row, "_index": i} for i, row in islice(enumerate(read_jsonl(path)), start, start + limit)]


def gsm8k_final(answer: str) -> str:
    """The `####` answer of a GSM8K solution, thousands commas dropped (the rl shards' expected_output)."""
    return (extract_gsm8k(answer) or "").replace(",", "")


def gsm8k_reply(answer: str) -> str:
    """The worked answer without calculator annotations, ending in GSM8K's `#### N` line (what the
    `string_match` reward with the `gsm8k` extractor reads)."""
    body, _, final = answer.partition("####")
    body = re.sub(r"<<[^>]*>>", "", body).strip()
    return f"{body}\n#### {final.strip()}"


def _wrong_final(reply: str, row_id: str) -> str:
    """The rejected answer of a synthetic pair: the same reply with its final `#### N` number moved
    (seeded by the row id, so a shard is the same on every run)."""
    wrong = perturb_final_answer(reply, random.Random(row_id))
    if wrong is None:  # GSM8K replies end in `#### N`: never without a number
        raise RufusError(f"{row_id}: no final number to change in {reply[-80:]!r}")
    return wrong


def write_rows(out: Path, rows: list[dict], kind: str, source: str, split: str = "train") -> Path:
    """Canonical rows into a shard folder with a manifest naming where they came from."""
    out = Path(out)
    write_shards(pa.Table.from_pylist(rows), out, split=split)
    write_manifest(out, {"command": f"tests/example_shards.py ({kind})", "source": source, "rows": len(rows)})
    return out


def gsm8k_rows(
    data_root: Path, split: str = "train", start: int = 0, limit: int = 64, max_chars: int | None = None
) -> list[dict]:
    """GSM8K rows from `start`; with `max_chars`, only problems whose question + answer are that
    short (tiny CPU runs keep the whole answer, including the final number, inside max_length)."""
    rows = _read_rows(Path(data_root) / "gsm8k" / f"{split}.jsonl", start, limit if max_chars is None else 10**9)
    if max_chars is not None:
        rows = [r for r in rows if len(r["question"]) + len(r["answer"]) <= max_chars][:limit]
    return rows


def gsm8k_sft(data_root: Path, out: Path, limit: int = 64, start: int = 0, max_chars: int | None = None) -> Path:
    rows = [
        {
            "id": f"gsm8k-{r['_index']}",
            "source": "gsm8k",
            "label": "math",
            "messages": [
                {"role": "user", "content": r["question"]},
                {"role": "assistant", "content": gsm8k_reply(r["answer"])},
            ],
        }
        for r in gsm8k_rows(data_root, "train", start, limit, max_chars)
    ]
    return write_rows(out, rows, "sft", "gsm8k/train.jsonl")


def gsm8k_preference(data_root: Path, out: Path, limit: int = 64, start: int = 0, max_chars: int | None = None) -> Path:
    rows = []
    for r in gsm8k_rows(data_root, "train", start, limit, max_chars):
        reply, row_id = gsm8k_reply(r["answer"]), f"gsm8k-{r['_index']}"
        rows.append(
            {
                "id": row_id,
                "source": "gsm8k",
                "label": "math",
                "prompt": [{"role": "user", "content": r["question"]}],
                "chosen": [{"role": "assistant", "content": reply}],
                "rejected": [{"role": "assistant", "content": _wrong_final(reply, row_id)}],
            }
        )
    return write_rows(out, rows, "preference", "gsm8k/train.jsonl")


def gsm8k_kto(data_root: Path, out: Path, limit: int = 64, start: int = 0, max_chars: int | None = None) -> Path:
    """Unpaired rows: even rows keep the gold answer (desirable), odd rows get a wrong final number."""
    rows = []
    for i, r in enumerate(gsm8k_rows(data_root, "train", start, limit, max_chars)):
        reply, row_id = gsm8k_reply(r["answer"]), f"gsm8k-{r['_index']}"
        good = i % 2 == 0
        rows.append(
            {
                "id": row_id,
                "source": "gsm8k",
                "label": "math",
                "prompt": [{"role": "user", "content": r["question"]}],
                "completion": [{"role": "assistant", "content": reply if good else _wrong_final(reply, row_id)}],
                "desirable": good,
            }
        )
    return write_rows(out, rows, "kto", "gsm8k/train.jsonl")


def gsm8k_rl(
    data_root: Path, out: Path, limit: int = 64, start: int = 0, split: str = "train", max_chars: int | None = None
) -> Path:
    rows = [
        {
            "id": f"gsm8k-{split}-{r['_index']}",
            "source": "gsm8k",
            "label": "math",
            "prompt": [{"role": "user", "content": r["question"]}],
            "expected_output": gsm8k_final(r["answer"]),
        }
        for r in gsm8k_rows(data_root, split, start, limit, max_chars)
    ]
    return write_rows(out, rows, "rl", f"gsm8k/{split}.jsonl")


# ------------------------------------------------------------------ one-step arithmetic

_CALCULATION = re.compile(r"<<([^=<>]+)=([^<>]+)>>")
_ONE_OPERATION = re.compile(r"(\d+)\s*([-+*/])\s*(\d+)")


def gsm8k_calculations(data_root: Path, count: int, skip: int = 0, seed: int = 0,
                       max_operand: int | None = None) -> list[tuple[str, str]]:
    """One-operation calculations with integer results from GSM8K train's calculator annotations
    (`<<48/2=24>>` -> ("48 / 2", "24")): real arithmetic from real solutions, each expression once,
    shuffled with `seed`; `skip` leaves the first ones to another split; `max_operand` keeps those
    whose two numbers are at most that. The built-in 135M model answers 17% of them right greedily
    (7% sampled at temperature 0.7); with operands up to 20, 45% (23%)."""
    seen: dict[str, str] = {}
    for row in read_jsonl(Path(data_root) / "gsm8k" / "train.jsonl"):
        for expression, value in _CALCULATION.findall(row["answer"]):
            match = _ONE_OPERATION.fullmatch(expression.strip())
            small = match and (max_operand is None or max(int(match.group(1)), int(match.group(3))) <= max_operand)
            if small and re.fullmatch(r"-?\d+", value.strip()):
                seen.setdefault(" ".join(match.groups()), value.strip())
    items = sorted(seen.items())
    random.Random(seed).shuffle(items)
    if skip + count > len(items):
        limit = f" with operands up to {max_operand}" if max_operand is not None else ""
        raise RufusError(f"GSM8K train has {len(items)} one-operation calculations{limit}; asked for {count} after {skip}")
    return items[skip : skip + count]


def calculation_question(expression: str) -> str:
    return f"What is {expression}? Answer with the number only."


def calculation_sft(items: list[tuple[str, str]], out: Path) -> Path:
    """`What is 48 / 2?` answered `48 / 2 = 24`."""
    rows = [{"id": f"calc-{i}", "source": "gsm8k/calculations", "label": "math",
             "messages": [{"role": "user", "content": calculation_question(e)},
                          {"role": "assistant", "content": f"{e} = {v}"}]}
            for i, (e, v) in enumerate(items)]
    return write_rows(out, rows, "sft", "gsm8k/train.jsonl calculator annotations")


def calculation_pair(expression: str, value: str, row_id: str) -> tuple[str, str]:
    """(chosen, rejected): `48 / 2 = 24`, and the same line with the result moved (`rufus-data
    pairs`' perturbation, seeded by the row id)."""
    chosen = f"{expression} = {value}"
    return chosen, _wrong_final(chosen, row_id)


def calculation_preference(items: list[tuple[str, str]], out: Path) -> Path:
    rows = []
    for i, (e, v) in enumerate(items):
        chosen, rejected = calculation_pair(e, v, f"calc-{i}")
        rows.append({"id": f"calc-{i}", "source": "gsm8k/calculations", "label": "math",
                     "prompt": [{"role": "user", "content": calculation_question(e)}],
                     "chosen": [{"role": "assistant", "content": chosen}],
                     "rejected": [{"role": "assistant", "content": rejected}]})
    return write_rows(out, rows, "preference", "gsm8k/train.jsonl calculator annotations")


def calculation_rl(items: list[tuple[str, str]], out: Path) -> Path:
    rows = [{"id": f"calc-{i}", "source": "gsm8k/calculations", "label": "math",
             "prompt": [{"role": "user", "content": calculation_question(e)}], "expected_output": v}
            for i, (e, v) in enumerate(items)]
    return write_rows(out, rows, "rl", "gsm8k/train.jsonl calculator annotations")


def code_alpaca_sft(data_root: Path, out: Path, limit: int = 64, start: int = 0) -> Path:
    rows = []
    for r in _read_rows(Path(data_root) / "code_alpaca_2k" / "code_alpaca_2k.jsonl", start, limit):
        question = r["instruction"] + (f"\n\n{r['input']}" if r.get("input") else "")
        rows.append(
            {
                "id": f"code_alpaca-{r['_index']}",
                "source": "code_alpaca_2k",
                "label": "code",
                "messages": [{"role": "user", "content": question}, {"role": "assistant", "content": r["output"]}],
            }
        )
    return write_rows(out, rows, "sft", "code_alpaca_2k/code_alpaca_2k.jsonl")
