"""BFCL (Berkeley Function Calling Leaderboard) AST categories: the rows, from the PyPI wheel `bfcl-eval`.

The data are the wheel's own `data/BFCL_v4_<category>.json` and `data/possible_answer/...` files;
its non-agentic categories (simple_python, multiple, parallel, ...) are BFCL v3's. The wheel is
fetched (never installed) by the `bfcl_ast` reward's module, rufus_data/rewards/bfcl.py, which also
holds the AST checker that scores these rows."""

from __future__ import annotations

import json
import zipfile

from rufus_data.base.errors import RufusError
from rufus_data.base.jsonl import parse_jsonl
from rufus_data.rewards.bfcl import wheel_path

SYSTEM_PROMPT = (
    "You are an expert in composing functions. You are given a question and a set of possible functions. "
    "Based on the question, you will need to make one or more function/tool calls to achieve the purpose.\n"
    "If none of the functions can be used, point it out. If the given question lacks the parameters required by "
    "the function, also point it out.\nYou should only return the function calls in your response.\n\n"
    "If you decide to invoke any of the function(s), you MUST put it in the format of "
    "[func_name1(params_name1=params_value1, params_name2=params_value2...), func_name2(params)]\n"
    "You SHOULD NOT include any other text in the response.\n\n"
    "Here is a list of functions in JSON format that you can invoke.\n{functions}\n"
)


def _jsonl_member(zf: zipfile.ZipFile, member: str) -> list[dict]:
    try:
        data = zf.read(member)
    except KeyError:
        raise RufusError(f"the bfcl-eval wheel has no {member}: check the category name") from None
    return list(parse_jsonl(data.splitlines(), f"{zf.filename}:{member}"))


def bfcl_rows(requirement: str, category: str) -> list[dict]:
    """One row per BFCL question: the user's question, the prompt (system text with the functions +
    the question), the function docs and the possible answers, for the AST checker."""
    with zipfile.ZipFile(wheel_path(requirement)) as zf:
        questions = _jsonl_member(zf, f"bfcl_eval/data/BFCL_v4_{category}.json")
        answers = {r["id"]: r["ground_truth"] for r in _jsonl_member(zf, f"bfcl_eval/data/possible_answer/BFCL_v4_{category}.json")}
    rows = []
    for q in questions:
        turn = q["question"][0]
        user = "\n".join(m["content"] for m in turn if m["role"] == "user")
        functions = json.dumps(q["function"], indent=2)
        rows.append({
            "id": q["id"],
            "question": user,  # what decontam checks: the system text and function docs are shared
            "question_text": SYSTEM_PROMPT.format(functions=functions) + "\nQuestion: " + user,
            "function": q["function"],
            "ground_truth": answers[q["id"]],
            "category": category,
        })
    return rows
