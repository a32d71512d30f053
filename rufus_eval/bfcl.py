"""BFCL (Berkeley Function Calling Leaderboard) AST categories from the PyPI wheel `bfcl-eval`.

The wheel pins dependencies that clash with ours (numpy==1.26.4, tree_sitter, vllm==0.8.5, ...),
so it is never installed: `pip download --no-deps` fetches it into the Rufus cache, and only what
the AST checker needs is unpacked into `$RUFUS_CACHE/bfcl/<wheel>/` (the checker, its type
converters, two constants modules) and imported; `constants/model_config.py`, which imports
every model SDK, is replaced by a stub (no model renames dots in function names here). The
data are the wheel's own `data/BFCL_v4_<category>.json` and `data/possible_answer/...` files;
its non-agentic categories (simple_python, multiple, parallel, ...) are BFCL v3's."""

from __future__ import annotations

import ast
import importlib
import json
import subprocess
import sys
import zipfile
from functools import cache
from pathlib import Path

from rufus_data.errors import RufusError
from rufus_data.paths import cache_dir

CHECKER_FILES = (
    "bfcl_eval/constants/enums.py",
    "bfcl_eval/constants/type_mappings.py",
    "bfcl_eval/eval_checker/ast_eval/ast_checker.py",
    "bfcl_eval/eval_checker/ast_eval/type_convertor/java_type_converter.py",
    "bfcl_eval/eval_checker/ast_eval/type_convertor/js_type_converter.py",
)
PACKAGES = ("bfcl_eval", "bfcl_eval/constants", "bfcl_eval/eval_checker", "bfcl_eval/eval_checker/ast_eval",
            "bfcl_eval/eval_checker/ast_eval/type_convertor")
MODEL_CONFIG_STUB = '''"""Rufus stub: the real module imports every model SDK; the AST checker only asks whether a
model renames dots in function names, which no model evaluated through Rufus does."""
from types import SimpleNamespace


class _NoRenames(dict):
    def __missing__(self, key):
        return SimpleNamespace(underscore_to_dot=False)


MODEL_CONFIG_MAPPING = _NoRenames()
'''
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


def wheel_path(requirement: str) -> Path:
    """The wheel for `requirement` (e.g. bfcl-eval==2026.3.23) in the Rufus cache, downloaded once."""
    folder = cache_dir() / "wheels"
    folder.mkdir(parents=True, exist_ok=True)
    name, _, version = requirement.partition("==")
    pattern = f"{name.replace('-', '_')}-{version or '*'}-*.whl"
    found = sorted(folder.glob(pattern))
    if found:
        return found[-1]
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-d", str(folder), requirement]
    proc = subprocess.run(cmd, check=False, capture_output=True, text=True)
    found = sorted(folder.glob(pattern))
    if proc.returncode != 0 or not found:
        raise RufusError(
            f"could not download {requirement} from PyPI (pip said: {proc.stderr.strip()[-300:]}); "
            f"put the wheel into {folder} by hand"
        )
    return found[-1]


@cache
def load_checker(requirement: str):
    """Import bfcl_eval's AST checker (and only it) from the wheel; returns (ast_checker, Language)."""
    wheel = wheel_path(requirement)
    root = cache_dir() / "bfcl" / wheel.stem
    if not (root / "bfcl_eval" / "eval_checker" / "ast_eval" / "ast_checker.py").exists():
        with zipfile.ZipFile(wheel) as zf:
            for member in CHECKER_FILES:
                target = root / member
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(zf.read(member))
        for package in PACKAGES:
            (root / package / "__init__.py").touch()
        (root / "bfcl_eval" / "constants" / "model_config.py").write_text(MODEL_CONFIG_STUB)
    loaded = sys.modules.get("bfcl_eval")
    if loaded is not None and not str(getattr(loaded, "__file__", "")).startswith(str(root)):
        raise RufusError(f"another bfcl_eval is already imported ({loaded.__file__}); run BFCL in a fresh process")
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    checker = importlib.import_module("bfcl_eval.eval_checker.ast_eval.ast_checker")
    enums = importlib.import_module("bfcl_eval.constants.enums")
    return checker.ast_checker, enums.Language


def _jsonl_member(zf: zipfile.ZipFile, member: str) -> list[dict]:
    try:
        text = zf.read(member).decode()
    except KeyError:
        raise RufusError(f"the bfcl-eval wheel has no {member}: check the category name") from None
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def bfcl_rows(requirement: str, category: str) -> list[dict]:
    """One row per BFCL question: the prompt (system text with the functions + the question),
    the function docs and the possible answers, for the AST checker."""
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
            "question_text": SYSTEM_PROMPT.format(functions=functions) + "\nQuestion: " + user,
            "function": q["function"],
            "ground_truth": answers[q["id"]],
            "category": category,
        })
    return rows


def parse_calls(text: str) -> list[dict] | None:
    """`[f(a=1), g(b="x")]` -> [{"f": {"a": 1}}, {"g": {"b": "x"}}]; None if it is not calls."""
    text = text.strip().strip("`").strip()
    if text.startswith("python"):
        text = text[len("python"):].strip()
    start, end = text.find("["), text.rfind("]")
    if start >= 0 and end > start:
        text = text[start:end + 1]
    try:
        tree = ast.parse(text, mode="eval").body
    except SyntaxError:
        return None
    calls = tree.elts if isinstance(tree, (ast.List, ast.Tuple)) else [tree]
    out = []
    for call in calls:
        if not isinstance(call, ast.Call) or call.args:
            return None
        try:
            out.append({ast.unparse(call.func): {kw.arg: ast.literal_eval(kw.value) for kw in call.keywords}})
        except (ValueError, SyntaxError):
            return None
    return out


def score_bfcl(answer: str, gold: dict, requirement: str = "bfcl-eval==2026.3.23") -> float:
    calls = parse_calls(answer)
    if not calls:
        return 0.0
    ast_checker, language = load_checker(requirement)
    result = ast_checker(gold["function"], calls, gold["ground_truth"], language.PYTHON, gold["category"], "rufus")
    return 1.0 if result.get("valid") else 0.0
