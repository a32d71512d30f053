"""What Rufus does to a benchmark's hub rows before a suite task reads them (the registry's
`convert:`). Each conversion keeps the row's own fields (decontam reads them) and adds what the
task's prompt and scorer read; a row that already has those fields (a local copy written by
`rufus-eval data pull`) passes through unchanged, so path, local and hub copies all work.

- `livecodebench`: livecodebench/code_generation_lite rows. `public_test_cases` is JSON;
  `private_test_cases` is JSON, or (the lite release) base64 of zlib of a pickle of the JSON
  string, as the dataset's own loader (lcb_runner/benchmarks/code_generation.py) reads it. The
  pickle is read with an unpickler that builds nothing but strings. stdin problems get
  `test_cases` ([{input, output}]); functional (LeetCode) problems get a HumanEval-style `test`
  that calls `Solution().<func_name>(*args)` on each case, with `entry_point: Solution`. Both get
  `format_instructions` (LiveCodeBench's prompt for the two kinds) and `code_prelude`, the
  import header LiveCodeBench's harness puts before every program.
- `gpqa`: Idavidrein/gpqa rows. The four choices shuffled once per question, seeded by its
  `Record ID` (so every run and machine sees the same order), as `choice1`..`choice4`, and the
  letter of the correct one as `answer`.
- `mmlu_pro`: TIGER-Lab/MMLU-Pro rows. Its up to ten `options` as `options_text` ("A. ...", one a
  line, in the dataset's order) for the prompt; `answer` is already the letter.
- `mixeval`: MixEval free-form rows. `question_text` is MixEval's own prompt
  (mix_eval/prompts/evaluation_prompts.py, construct_prompt_freeform) and `reference` the gold
  answers as its judge reads them (`<answer 1> ... <answer 2> ...`)."""

from __future__ import annotations

import base64
import hashlib
import io
import json
import pickle
import random
import zlib
from collections.abc import Callable, Iterable, Iterator

from rufus_data.base.errors import RufusError

LCB_STDIN_FORMAT = (
    "Read the inputs from stdin solve the problem and write the answer to stdout (do not directly test on the "
    "sample inputs). Enclose your code within delimiters as follows. Ensure that when the python program runs, it "
    "reads the inputs, runs the algorithm and writes output to STDOUT.\n```python\n# YOUR CODE HERE\n```"
)
LCB_STARTER_FORMAT = (
    "You will use the following starter code to write the solution to the problem and enclose your code within "
    "delimiters.\n```python\n{starter_code}\n```"
)
# what LiveCodeBench's harness (lcb_runner/evaluation/testing_util.py) puts before every program
LCB_PRELUDE = "\n".join([
    *(f"from {m} import *" for m in ("string", "re", "datetime", "collections", "heapq", "bisect", "copy", "math",
                                     "random", "statistics", "itertools", "functools", "operator", "io", "sys",
                                     "json", "builtins", "typing")),
    *(f"import {m}" for m in ("string", "re", "datetime", "collections", "heapq", "bisect", "copy", "math",
                              "random", "statistics", "itertools", "functools", "operator", "io", "sys", "json")),
    "sys.setrecursionlimit(50000)",
])
# a functional case: one JSON value per input line (the arguments), the output one JSON value
LCB_FUNCTIONAL_CHECK = '''import json as _lcb_json


def check(candidate):
    for case in _lcb_json.loads({cases!r}):
        args = [_lcb_json.loads(line) for line in case["input"].split("\\n")]
        expected = _lcb_json.loads(case["output"])
        got = getattr(candidate(), {func_name!r})(*args)
        if isinstance(got, tuple):
            got = list(got)
        assert got == expected, f"input {{case['input']!r}}: expected {{expected!r}}, got {{got!r}}"
'''
MIXEVAL_SHORT = "Answer the question shortly."
MIXEVAL_STEPS = "Answer the question. \nLet's think step by step."


class _StringsOnly(pickle.Unpickler):
    """LiveCodeBench pickles a JSON string; anything that would build an object is refused."""

    def find_class(self, module: str, name: str):
        raise pickle.UnpicklingError(f"refusing to load {module}.{name}: the test cases must be a pickled string")


def decode_test_cases(value, what: str) -> list[dict]:
    """LiveCodeBench test cases: a JSON list, or base64(zlib(pickle(JSON string))) (the lite release)."""
    if isinstance(value, list):
        return value
    try:
        return json.loads(value)
    except (TypeError, json.JSONDecodeError):
        pass
    try:
        text = _StringsOnly(io.BytesIO(zlib.decompress(base64.b64decode(value.encode("utf-8"))))).load()
        cases = json.loads(text)
    except (ValueError, TypeError, zlib.error, pickle.UnpicklingError, EOFError) as err:
        raise RufusError(f"{what}: its test cases are neither JSON nor base64+zlib+pickle of JSON ({err}); is this "
                         "a row of livecodebench/code_generation_lite?") from None
    if not isinstance(cases, list):
        raise RufusError(f"{what}: its test cases decode to {type(cases).__name__}, not a list of cases")
    return cases


def livecodebench_row(row: dict, index: int) -> dict:
    if "format_instructions" in row:
        return row
    what = f"LiveCodeBench row {index} ({row.get('question_id')})"
    missing = [k for k in ("question_content", "public_test_cases", "private_test_cases") if k not in row]
    if missing:
        raise RufusError(f"{what} has no {missing} (fields: {sorted(row)}): not a code_generation_lite row")
    cases = [{"input": c["input"], "output": c["output"], "testtype": c.get("testtype", "stdin")}
             for c in decode_test_cases(row["public_test_cases"], what) + decode_test_cases(row["private_test_cases"], what)]
    metadata = row.get("metadata") or {}
    metadata = json.loads(metadata) if isinstance(metadata, str) else metadata
    functional = any(c["testtype"] == "functional" for c in cases)
    out = {k: v for k, v in row.items() if k not in ("public_test_cases", "private_test_cases")}
    out["code_prelude"] = LCB_PRELUDE
    if functional:
        func_name = metadata.get("func_name")
        if not func_name:
            raise RufusError(f"{what}: functional test cases but no func_name in its metadata")
        out.update(test=LCB_FUNCTIONAL_CHECK.format(cases=json.dumps(cases), func_name=func_name),
                   entry_point="Solution", test_cases=None,
                   format_instructions=LCB_STARTER_FORMAT.format(starter_code=row.get("starter_code") or ""))
    else:
        out.update(test=None, entry_point=None, test_cases=json.dumps(cases), format_instructions=LCB_STDIN_FORMAT)
    return out


def _clean_choice(text) -> str:
    """lm-eval's GPQA preprocessing of a choice (strip, ' [title]' -> '. ', double spaces)."""
    return str(text or "").strip().replace(" [title]", ". ").replace("  ", " ")


def gpqa_row(row: dict, index: int) -> dict:
    if "choice1" in row and "answer" in row:
        return row
    fields = ("Question", "Correct Answer", "Incorrect Answer 1", "Incorrect Answer 2", "Incorrect Answer 3")
    missing = [k for k in fields if k not in row]
    if missing:
        raise RufusError(f"GPQA row {index} has no {missing} (fields: {sorted(row)}): not a row of Idavidrein/gpqa")
    correct = _clean_choice(row["Correct Answer"])
    choices = [_clean_choice(row[f"Incorrect Answer {i}"]) for i in (1, 2, 3)] + [correct]
    seed = hashlib.sha256(str(row.get("Record ID", index)).encode()).digest()
    random.Random(seed).shuffle(choices)
    return {**row, **{f"choice{i + 1}": c for i, c in enumerate(choices)}, "answer": "ABCD"[choices.index(correct)]}


def mmlu_pro_row(row: dict, index: int) -> dict:
    if "options_text" in row:
        return row
    missing = [k for k in ("question", "options", "answer") if k not in row]
    if missing or not isinstance(row.get("options"), list) or not 0 < len(row["options"]) <= 10:
        raise RufusError(f"MMLU-Pro row {index} has no {missing or ['options (a list of 1-10)']} (fields: "
                         f"{sorted(row)}): not a row of TIGER-Lab/MMLU-Pro")
    lines = [f"{letter}. {str(option).strip()}" for letter, option in zip("ABCDEFGHIJ", row["options"])]
    return {**row, "options_text": "\n".join(lines)}


def _has_text(value) -> bool:
    return value is not None and str(value).lower() not in ("none", "null") and str(value).replace(" ", "") != ""


def mixeval_row(row: dict, index: int) -> dict:
    if "question_text" in row:
        return row
    missing = [k for k in ("prompt", "target") if k not in row]
    if missing:
        raise RufusError(f"MixEval row {index} has no {missing} (fields: {sorted(row)}): not a MixEval free-form row")
    benchmark = row.get("benchmark_name")
    instruction = MIXEVAL_STEPS if benchmark in ("BBH", "GSM8k", "MATH") else MIXEVAL_SHORT
    question = f"{row['prompt']}\n{instruction}"
    context = row.get("context")
    question = f"Question: {context}\n{question}" if _has_text(context) else f"Question: {question}"
    targets = row["target"] if isinstance(row["target"], list) else [row["target"]]
    reference = " ".join(f"<answer {i + 1}> {t}" for i, t in enumerate(targets))
    return {**row, "question_text": question, "reference": reference}


CONVERTERS: dict[str, Callable[[dict, int], dict]] = {
    "livecodebench": livecodebench_row,
    "gpqa": gpqa_row,
    "mixeval": mixeval_row,
    "mmlu_pro": mmlu_pro_row,
}


def converter(name: str) -> Callable[[dict, int], dict]:
    try:
        return CONVERTERS[name]
    except KeyError:
        raise RufusError(f"unknown conversion {name!r} in catalogs/benchmarks.yaml: use one of "
                         f"{', '.join(CONVERTERS)}") from None


def convert_rows(name: str | None, rows: Iterable[dict]) -> Iterator[dict]:
    """The rows with the named conversion applied (none: as they are)."""
    if name is None:
        yield from rows
        return
    convert = converter(name)
    for index, row in enumerate(rows):
        yield convert(dict(row), index)
