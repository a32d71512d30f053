"""Reference checks of the built-in eval tasks (docs/eval.md, "Reference checks"): outputs nobody here
wrote, scored through each task's own lm-eval scoring path (rufus_eval/replay.py), against the
figures their authors published. tests/test_eval_references.py asserts the same figures.

    RUFUS_DATA_ROOT=../shared/data .venv/bin/python bench/eval_references.py [gsm8k ifeval math500 aime25 gsm_plus humaneval mbpp]

- gsm8k: the GSM-Plus authors' released GSM8K test predictions of 8 models (gsm_plus_predictions/),
  by the quick suite's gsm8k task, against the gold each model was scored against (the authors
  relabelled 11 GSM8K golds for the two GPT runs: 10 flawed questions to "None", one 14 to 7) and
  against GSM8K's own gold; with the items where Rufus and the authors' per-item `result` disagree.
- ifeval: Google's released GPT-4 responses (ifeval_gpt4_responses/), by the ifeval task, all four
  figures of the IFEval paper's Table 3, and the prompts where Google's own verdicts differ.
- math500, aime25, gsm_plus: the gold answer, boxed, as the response (a GSM-Plus critical-thinking
  row: a response declining to answer); humaneval: the prompt plus its canonical
  solution; mbpp (no built-in task: one over the registry's `mbpp` benchmark, the code_execution
  scorer as docs/eval.md gives it): the reference code. Every one must pass.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path

from rich.table import Table

from rufus_data.base.console import print_result
from rufus_data.base.errors import RufusError
from rufus_data.base.jsonl import read_jsonl as stream_jsonl
from rufus_data.benchmarks.suite import Suite, Task, load_suite
from rufus_data.sources.dataset_source import DatasetSource
from rufus_eval.replay import score_responses

# results/model_performance_all.json of qtli/GSM-Plus: file name -> (model, published GSM8K accuracy)
GSM8K_PUBLISHED = {
    "gpt4": ("GPT-4", 93.25), "gpt-3.5-turbo": ("GPT-3.5-Turbo", 73.62),
    "metamath_7b": ("MetaMath-7B", 66.72), "metamath_13b": ("MetaMath-13B", 70.81), "metamath_70b": ("MetaMath-70B", 82.11),
    "abel_7b": ("Abel-7B", 59.51), "abel_13b": ("Abel-13B", 66.72), "abel_70b": ("Abel-70B", 83.85),
}
# Zhou et al. 2023, "Instruction-Following Evaluation for Large Language Models", Table 3, GPT-4
IFEVAL_TABLE3 = {"prompt_strict": 76.89, "prompt_loose": 79.30, "inst_strict": 83.57, "inst_loose": 85.37}
IFEVAL_RESPONSES = "ifeval_gpt4_responses/input_response_data_gpt4_20231107_145030.jsonl"
PROMPT_KEY_CHARS = 150  # one prompt was reworded after GPT-4 answered it; its first 150 characters were not

MBPP_TASK = {
    "name": "mbpp", "kind": "rufus", "role": "validation", "benchmark": "mbpp",
    "prompt": "{prompt}\nYour code should pass this test:\n{first_test}",
    "gold_fields": ["test_list", "test_imports"], "scorer": {"name": "code_execution", "timeout_s": 10}, "metric": "pass@1",
}


def read_jsonl(path: Path) -> list[dict]:
    return list(stream_jsonl(path))


def data_root() -> Path:
    root = os.environ.get("RUFUS_DATA_ROOT")
    if not root:
        raise RufusError("set RUFUS_DATA_ROOT to the folder laid out like shared/data (README there)")
    return Path(root)


def one_sample(suite: Suite, task: Task) -> tuple[Suite, Task]:
    """The suite and task with k = 1: one released response per document."""
    return suite.model_copy(update={"repeats": 1}), task.model_copy(update={"repeats": None})


def builtin_task(suite_name: str, task_name: str) -> tuple[Suite, Task]:
    suite = load_suite(suite_name)
    return one_sample(suite, next(t for t in suite.tasks if t.name == task_name))


def percent(value: float | None) -> float | None:
    return None if value is None else round(100 * value, 2)


# ---------------------------------------------------------------- GSM8K: the GSM-Plus authors' predictions


def released_gsm8k(model: str) -> tuple[list[dict], list[str]]:
    """(the released rows, each one's response text), checked to be GSM8K's test set in order."""
    rows = read_jsonl(data_root() / "gsm_plus_predictions" / f"{model}.jsonl")
    test = read_jsonl(data_root() / "gsm8k" / "test.jsonl")
    for index, (row, item) in enumerate(zip(rows, test, strict=True)):
        if item["question"].strip() not in (row.get("question") or row.get("input") or ""):
            raise RufusError(f"gsm_plus_predictions/{model}.jsonl row {index} is not GSM8K test question {index}")
    return rows, [(row["model_prediction"] if "model_prediction" in row else row["completion"]) or "" for row in rows]


def gsm8k_check(model: str, work: Path) -> dict:
    """The quick suite's gsm8k task on one model's released predictions."""
    suite, task = builtin_task("quick", "gsm8k")
    rows, texts = released_gsm8k(model)
    responses = dict(enumerate(texts))
    own_gold = score_responses(suite, task, responses)
    # the gold the authors scored against: the released rows' `answer`, as the task's data
    data = work / f"gsm8k-{model}.jsonl"
    test = read_jsonl(data_root() / "gsm8k" / "test.jsonl")
    data.write_text("".join(json.dumps({"id": i, "question": item["question"], "answer": str(row["answer"])}) + "\n"
                            for i, (row, item) in enumerate(zip(rows, test))))
    authors_task = task.model_copy(update={"benchmark": None, "data": DatasetSource(path=str(data))})
    authors_gold = score_responses(suite, authors_task, responses)
    verdicts = [bool(row["result"]) for row in rows]
    ours = [score == 1.0 for score in authors_gold.per_document()]
    name, published = GSM8K_PUBLISHED[model]
    return {
        "model": name, "rufus": percent(authors_gold.value), "published": published,
        "disagree": sum(a != b for a, b in zip(ours, verdicts)), "docs": len(rows),
        "gsm8k_gold": percent(own_gold.value), "released_flags": round(100 * sum(verdicts) / len(verdicts), 2),
    }


# ---------------------------------------------------------------- IFEval: Google's GPT-4 responses


def ifeval_responses() -> tuple[list[dict], dict[int, str]]:
    """(the IFEval prompts, key -> GPT-4's response), matched by the prompt's first 150 characters."""
    prompts = read_jsonl(data_root() / "ifeval" / "input_data.jsonl")
    by_head = {row["prompt"][:PROMPT_KEY_CHARS]: row["response"] for row in read_jsonl(data_root() / IFEVAL_RESPONSES)}
    missing = [p["key"] for p in prompts if p["prompt"][:PROMPT_KEY_CHARS] not in by_head]
    if missing:
        raise RufusError(f"{IFEVAL_RESPONSES}: no response for IFEval key(s) {missing}")
    return prompts, {p["key"]: by_head[p["prompt"][:PROMPT_KEY_CHARS]] for p in prompts}


def ifeval_check() -> dict:
    """Table 3's four figures by the ifeval task, its scorer at each mode and level. Instruction
    level is over all instructions (Table 3's), the task's per-prompt fractions weighted by count."""
    suite, task = builtin_task("quick", "ifeval")
    prompts, responses = ifeval_responses()
    counts = [len(p["instruction_id_list"]) for p in prompts]
    out: dict = {"docs": len(prompts)}
    for mode in ("strict", "loose"):
        prompt_level = score_responses(suite, task.model_copy(update={"scorer": task.scorer.with_options(mode=mode)}), responses)
        inst_task = task.model_copy(update={"scorer": task.scorer.with_options(mode=mode, level="instruction")})
        fractions = score_responses(suite, inst_task, responses).per_document()
        out[f"prompt_{mode}"] = percent(prompt_level.value)
        out[f"inst_{mode}"] = percent(sum(f * n for f, n in zip(fractions, counts)) / sum(counts))
        google = {row["prompt"][:PROMPT_KEY_CHARS]: row["follow_all_instructions"]
                  for row in read_jsonl(data_root() / "ifeval_gpt4_responses" / f"eval_results_{mode}.jsonl")}
        ours = dict(zip((p["prompt"][:PROMPT_KEY_CHARS] for p in prompts), prompt_level.per_document()))
        out[f"google_{mode}_disagree"] = sorted(p["key"] for p in prompts if p["prompt"][:PROMPT_KEY_CHARS] in google
                                                and google[p["prompt"][:PROMPT_KEY_CHARS]] != (ours[p["prompt"][:PROMPT_KEY_CHARS]] == 1.0))
    return out


# ---------------------------------------------------------------- gold answers and canonical solutions


def failing(result, ids: list) -> list:
    """The ids of documents that did not score 1 (unscored included), in document order."""
    return [i for i, score in zip(ids, result.per_document()) if score != 1.0]


def math500_check() -> dict:
    suite, task = builtin_task("quick", "math500")
    rows = read_jsonl(data_root() / "math500" / "test.jsonl")
    result = score_responses(suite, task, {r["unique_id"]: f"The final answer is $\\boxed{{{r['answer']}}}$" for r in rows})
    return {"docs": len(rows), "value": percent(result.value), "failing": failing(result, [r["unique_id"] for r in rows])}


def aime25_check() -> dict:
    suite, task = builtin_task("smollm3", "aime25")
    rows = read_jsonl(data_root() / "aime25" / "test.jsonl")
    ids = [f"{r['competition']}/{r['id']}" for r in rows]
    result = score_responses(suite, task, {i: f"The final answer is $\\boxed{{{r['answer']}}}$" for i, r in zip(ids, rows)})
    return {"docs": len(rows), "value": percent(result.value), "failing": failing(result, ids)}


# what a response that declines a critical-thinking question says (one of the GSM-Plus authors' phrases)
DECLINES = "The question does not provide enough information to determine the answer."


def gsm_plus_check() -> dict:
    """The gold answer, boxed, as the response; a critical-thinking row (gold "None") answered by declining."""
    suite, task = builtin_task("smollm3", "gsm_plus")
    rows = read_jsonl(data_root() / "gsm_plus" / "testmini.jsonl")
    responses = {str(i): DECLINES if r["answer"] == "None" else f"The final answer is $\\boxed{{{r['answer']}}}$"
                 for i, r in enumerate(rows)}
    result = score_responses(suite, task, responses)
    return {"docs": len(rows), "value": percent(result.value), "failing": failing(result, list(range(len(rows))))}


def humaneval_check() -> dict:
    suite, task = builtin_task("quick", "humaneval")
    rows = read_jsonl(data_root() / "humaneval" / "HumanEval.jsonl")
    responses = {r["task_id"]: f"```python\n{r['prompt']}{r['canonical_solution']}```" for r in rows}
    result = score_responses(suite, task, responses)
    return {"docs": len(rows), "value": percent(result.value), "failing": failing(result, [r["task_id"] for r in rows])}


def mbpp_check() -> dict:
    suite = Suite.model_validate({"name": "references", "repeats": 1, "tasks": [MBPP_TASK]})
    task = suite.tasks[0]
    rows = [r for r in read_jsonl(data_root() / "mbpp_sanitized" / "sanitized-mbpp.jsonl") if 11 <= r["task_id"] <= 510]
    for row in rows:  # the prompt names the function through the first test, as MBPP's own prompts do
        row["first_test"] = row["test_list"][0]
    data = Path(tempfile.mkdtemp(prefix="rufus-mbpp-")) / "mbpp.jsonl"
    data.write_text("".join(json.dumps({"id": r["task_id"], **r}) + "\n" for r in rows))
    task = task.model_copy(update={"benchmark": None, "data": DatasetSource(path=str(data))})
    result = score_responses(suite, task, {r["task_id"]: f"```python\n{r['code']}\n```" for r in rows})
    return {"docs": len(rows), "value": percent(result.value), "failing": failing(result, [r["task_id"] for r in rows])}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("checks", nargs="*", default=["gsm8k", "ifeval", "math500", "aime25", "gsm_plus", "humaneval", "mbpp"])
    args = parser.parse_args()
    if "gsm8k" in args.checks:
        table = Table("model", "Rufus", "published", "disagree with authors' result", "GSM8K's own gold",
                      "authors' released flags", title="gsm8k (quick) on the GSM-Plus authors' released predictions")
        with tempfile.TemporaryDirectory() as work:
            for model in GSM8K_PUBLISHED:
                row = gsm8k_check(model, Path(work))
                table.add_row(row["model"], f"{row['rufus']:.2f}", f"{row['published']:.2f}",
                              f"{row['disagree']} ({100 * row['disagree'] / row['docs']:.1f} %)",
                              f"{row['gsm8k_gold']:.2f}", f"{row['released_flags']:.2f}")
        print_result(table)
    if "ifeval" in args.checks:
        got = ifeval_check()
        table = Table("IFEval, GPT-4", "Rufus", "Table 3", title=f"ifeval (quick) on Google's released GPT-4 responses ({got['docs']})")
        for key, paper in IFEVAL_TABLE3.items():
            table.add_row(key, f"{got[key]:.2f}", f"{paper:.2f}")
        print_result(table)
        print_result(f"prompts where Google's verdict differs: strict {got['google_strict_disagree']}, "
                     f"loose {got['google_loose_disagree']}")
    for name, check in (("math500", math500_check), ("aime25", aime25_check), ("gsm_plus", gsm_plus_check),
                        ("humaneval", humaneval_check), ("mbpp", mbpp_check)):
        if name in args.checks:
            got = check()
            print_result(f"{name}: {got['value']:.2f} % of {got['docs']} pass; failing: {got['failing'] or 'none'}")


if __name__ == "__main__":
    main()
