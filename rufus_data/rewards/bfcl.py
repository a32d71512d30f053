"""BFCL (Berkeley Function Calling Leaderboard) AST reward: the answer's calls against the row's possible answers.

The checker is BFCL's own `ast_checker`, from the PyPI wheel `bfcl-eval`. The wheel pins dependencies
that clash with ours (numpy==1.26.4, tree_sitter, vllm==0.8.5, ...), so it is never installed:
`pip download --no-deps` fetches it into the Rufus cache, and only what the AST checker needs is
unpacked into `$RUFUS_CACHE/bfcl/<wheel>/` (the checker, its type converters, two constants modules)
and imported; `constants/model_config.py`, which imports every model SDK, is replaced by a stub (no
model renames dots in function names here). Rows carry BFCL's `function` (the function docs),
`ground_truth` (the possible answers) and `category` (e.g. simple_python, multiple, parallel): the
checker's rules differ per category. rufus_data/benchmarks/bfcl.py reads those rows from the same wheel.
"""

from __future__ import annotations

import ast
import importlib
import json
import subprocess
import sys
import zipfile
from collections.abc import Mapping
from functools import cache
from pathlib import Path

from rufus_data.base.errors import RufusError
from rufus_data.base.paths import cache_dir, data_root
from rufus_data.rewards.contract import RewardFunction, is_missing

BFCL_WHEEL = "bfcl-eval==2026.3.23"
ROW_COLUMNS = ("function", "ground_truth", "category")
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


def wheel_path(requirement: str) -> Path:
    """The wheel for `requirement` (e.g. bfcl-eval==2026.3.23): a copy under $RUFUS_DATA_ROOT/wheels
    (`rufus-eval data pull` puts it there for offline machines), else the Rufus cache, downloaded once."""
    folder = cache_dir() / "wheels"
    folder.mkdir(parents=True, exist_ok=True)
    name, _, version = requirement.partition("==")
    pattern = f"{name.replace('-', '_')}-{version or '*'}-*.whl"
    root = data_root(required=False)
    for place in ([root / "wheels"] if root else []) + [folder]:
        found = sorted(place.glob(pattern))
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


def _json_value(value):
    """A row value as BFCL wrote it: lists and dicts, or their JSON text (a parquet column)."""
    return json.loads(value) if isinstance(value, str) else value


def score_bfcl(answer: str, row: Mapping, requirement: str = BFCL_WHEEL) -> float:
    """1.0 when the calls in `answer` pass the AST checker for `row` (function, ground_truth, category)."""
    calls = parse_calls(answer)
    if not calls:
        return 0.0
    ast_checker, language = load_checker(requirement)
    result = ast_checker(_json_value(row["function"]), calls, _json_value(row["ground_truth"]), language.PYTHON,
                         row["category"], "rufus")
    return 1.0 if result.get("valid") else 0.0


class BFCLASTReward(RewardFunction):
    """1.0 when the answer's Python-style calls pass BFCL's AST checker, else 0.0 (no calls: 0.0); None
    for a row without `function`, `ground_truth` or `category`. `wheel`: the bfcl-eval release whose
    checker is used."""

    def __init__(self, wheel: str = BFCL_WHEEL, only_label: str | None = None):
        self.wheel = wheel
        self.name = "bfcl_ast"
        super().__init__(only_label=only_label)

    def score_rows(self, prompts, texts, closed, rows, log_metric):
        for column in ROW_COLUMNS:
            self.warn_missing_column(rows, column, "BFCL rows carry function, ground_truth and category")
        scores: list[float | None] = []
        for text, ok, row in zip(texts, closed, rows):
            if any(is_missing(row.get(column)) for column in ROW_COLUMNS):
                scores.append(None)
            else:
                scores.append(score_bfcl(text, row, self.wheel) if ok else 0.0)
        return scores
