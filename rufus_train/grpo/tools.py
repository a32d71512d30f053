"""Tools for the agent stages, in the form TRL's GRPOTrainer calls them during generation.

A tool is a module-level function with type hints and a Google-style docstring (transformers
turns those into the JSON schema shown to the model); a stateful tool is a method of an
*environment* class, created once per rollout by `environment_factory` and `reset` with the
dataset row. All of them are module-level and picklable, as the async trainer's spawned worker
needs.

- `calculator`: exact arithmetic on an expression, evaluated from its syntax tree (no eval).
- `run_python`: runs code in the rewards package's sandbox (namespaces + rlimits) and returns
  what it prints.
- `CodingEnvironment`: `run_python` plus `run_tests`, which checks code against the row's own
  tests (HumanEval `test`/`entry_point` or MBPP `test_list`) with the code-execution reward.
- `SearchEnvironment`: `search` over a local duckdb BM25 index (search_index.py beside it).

`enable_tool_parsing` gives the tokenizer the response template TRL needs to read tool calls
back out of completions written with the Rufus ChatML template."""

from __future__ import annotations

import ast
import functools
import operator

from rufus_data.base.errors import RufusError
from rufus_data.rewards.code_execution import TEST_COLUMNS, CodeExecutionReward
from rufus_data.rewards.response_schema import RUFUS_RESPONSE_TEMPLATE
from rufus_data.rewards.sandbox import SandboxConfig, run_program
from rufus_train.grpo.search_index import SearchIndex

TOOL_OUTPUT_CHARS = 2000

# How a Rufus ChatML reply is parsed back into a message lives with the rewards' response
# parsing (one definition): TRL matches templates byte for byte and does not know the Rufus one.


def enable_tool_parsing(tokenizer):
    """Set the Rufus response template unless the tokenizer already has one; refuse templates that cannot do tools."""
    from trl.chat_template_utils import supports_tool_calling  # heavy: only when a run sets up its tokenizer

    if getattr(tokenizer, "response_template", None) is None and getattr(tokenizer, "response_schema", None) is None:
        if "<|im_start|>" not in (tokenizer.chat_template or ""):
            raise RufusError(
                "the tokenizer's chat template is not ChatML and has no response_template: TRL cannot parse tool "
                "calls from its completions. Use the Rufus ChatML template (built-in models have it) or set "
                "tokenizer.response_template"
            )
        tokenizer.response_template = RUFUS_RESPONSE_TEMPLATE
    if not supports_tool_calling(tokenizer):
        raise RufusError(
            "the tokenizer's chat template cannot render a tool-calling conversation (user -> assistant tool_calls "
            "-> tool): use the Rufus ChatML template"
        )
    return tokenizer


# ------------------------------------------------------------------------------ calculator

_BINARY = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow,
}
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}


def _evaluate(node: ast.AST):
    if isinstance(node, ast.Expression):
        return _evaluate(node.body)
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _evaluate(node.left), _evaluate(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > 64:
            raise ValueError("exponent too large (at most 64)")
        return _BINARY[type(node.op)](left, right)
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_evaluate(node.operand))
    raise ValueError(f"unsupported syntax: {ast.dump(node)[:60]}")


def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression exactly.

    Args:
        expression: Numbers with + - * / // % ** and parentheses, for example "(12 + 3) * 4".

    Returns:
        The value of the expression, or an error message.
    """
    try:
        value = _evaluate(ast.parse(expression.replace("^", "**"), mode="eval"))
    except ZeroDivisionError:
        return "error: division by zero"
    except (SyntaxError, ValueError, TypeError, OverflowError) as err:
        return f"error: {err}"
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return str(value)


# ------------------------------------------------------------------------------ python in the sandbox


def run_python(code: str) -> str:
    """Run a Python program in a sandbox (no network, no files kept, 10 s) and return what it prints.

    Args:
        code: The Python source to run; use print() to show results.

    Returns:
        The program's standard output and errors.
    """
    result = run_program(code, config=SandboxConfig(timeout_s=10.0, cpu_s=10, memory_mb=512))
    text = result.stdout
    if result.stderr.strip():
        text += ("\n" if text else "") + result.stderr
    if result.timed_out:
        text += "\n[timed out after 10 s]"
    return text[-TOOL_OUTPUT_CHARS:] or "(no output)"


class CodingEnvironment:
    """One coding rollout: the row's tests are kept at reset and checked by `run_tests`."""

    def __init__(self):
        self.tests: dict = {}

    def reset(self, **row) -> None:
        self.tests = {k: row[k] for k in TEST_COLUMNS if row.get(k) is not None}

    def run_python(self, code: str) -> str:
        """Run a Python program in a sandbox (no network, 10 s) and return what it prints.

        Args:
            code: The Python source to run; use print() to show results.

        Returns:
            The program's standard output and errors.
        """
        return run_python(code)

    def run_tests(self, code: str) -> str:
        """Check a solution against this task's hidden tests.

        Args:
            code: The complete solution (function definitions) to test.

        Returns:
            Whether all tests pass.
        """
        if not self.tests:
            return "this task has no tests"
        reward = CodeExecutionReward(workers=1, timeout_s=10.0)
        score = reward(completions=[code], **{k: [v] for k, v in self.tests.items()})[0]
        return "all tests passed" if score == 1.0 else "some tests failed"


# ------------------------------------------------------------------------------ search


class SearchEnvironment:
    """One search rollout over a local BM25 index (read-only duckdb file)."""

    def __init__(self, index_path: str, k: int = 3):
        self.index = SearchIndex(index_path)
        self.k = k

    def reset(self, **row) -> None:
        return None

    def search(self, query: str) -> str:
        """Search the document collection.

        Args:
            query: Keywords to look for.

        Returns:
            The best matching documents, one per line.
        """
        hits = self.index.search(query, k=self.k)
        if not hits:
            return "no results"
        return "\n".join(f"[{hit['id']}] {hit['text']}" for hit in hits)[:TOOL_OUTPUT_CHARS]


def search_environment_factory(index_path: str, k: int = 3):
    """A picklable factory of SearchEnvironment bound to one index."""
    return functools.partial(SearchEnvironment, str(index_path), k)


TOOLS = {"calculator": calculator, "run_python": run_python}
