"""Code-execution reward: run the completion's code against the row's tests in the sandbox.

Test formats (dataset columns):
- HumanEval: `test` (defines `check(candidate)`) + `entry_point`;
- MBPP: `test_list` (assert statements), with `test_imports` prepended;
- stdin/stdout (LiveCodeBench / APPS): `input_output` ({"inputs": [...], "outputs": [...]}, or its JSON)
  or `test_cases` ([{"input":..., "output":...}], or its JSON); one sandbox run per case.
A `code_prelude` column goes before the answer's code in every run (LiveCodeBench's import header,
as its own harness adds it).
`prompt_imports=True` puts the import lines of the prompt the model saw before the answer's code
(HumanEval prompts import `typing` etc., and an answer that repeats only the function lacks them).
HumanEval/MBPP programs run under harness.py inside the sandbox: it passes only if it exits 0 AND prints a
per-run random marker that the harness writes after the tests ran. The marker reaches the harness on a
file descriptor it reads and closes before the model's code runs, so the model's code cannot read it
from its program, arguments or environment, and `sys.exit(0)` before the tests does not pass.
"""

from __future__ import annotations

import json
import re
import secrets
from dataclasses import dataclass, field
from pathlib import Path

from rufus_data.rewards.contract import RewardFunction, Row, is_missing
from rufus_data.rewards.sandbox import SandboxConfig, SandboxResult, run_many

_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[^\n]*\n(.*?)```", re.DOTALL)


def extract_code(text: str) -> str:
    """The last fenced Python block (```python / ```py / ```), else the whole text."""
    blocks = [(lang.lower(), body) for lang, body in _FENCE.findall(text)]
    python = [body for lang, body in blocks if lang in ("python", "py", "python3", "")]
    if python:
        return python[-1]
    return text


HARNESS = Path(__file__).with_name("harness.py").read_text()
# the row columns a code reward reads its tests from (HumanEval, MBPP, APPS, LiveCodeBench)
TEST_COLUMNS = ("test", "entry_point", "test_list", "test_imports", "input_output", "test_cases", "code_prelude")


@dataclass
class _Job:
    completion: int
    program: str  # stdin/stdout cases: the model's program; HumanEval/MBPP: what the harness runs
    stdin: str | None = None
    expected: str | None = None  # stdin/stdout cases: the expected output
    marker: str | None = None  # HumanEval/MBPP: the line the harness prints after the tests
    asserts: list[str] = field(default_factory=list)  # fraction mode: MBPP asserts, run one by one

    def sandbox_job(self) -> tuple:
        """(program, stdin, inputs) for sandbox.run_many; the marker travels as an input, never as source."""
        if self.marker is None:
            return (self.program, self.stdin)
        inputs = [self.marker.encode(), self.program.encode(), *(a.encode() for a in self.asserts)]
        return (HARNESS, self.stdin, inputs)


def prompt_import_lines(prompt) -> str:
    """The lines of a prompt (text, or chat messages) that start with `import ` or `from `."""
    if isinstance(prompt, (list, tuple)):
        prompt = "\n".join(str(m.get("content") or "") for m in prompt if isinstance(m, dict))
    return "\n".join(line for line in str(prompt or "").splitlines() if line.startswith(("import ", "from ")))


def _humaneval_source(code: str, test: str, entry_point: str) -> str:
    return f"{code}\n\n{test}\n\ncheck({entry_point})\n"


def _mbpp_source(code: str, imports: list[str], asserts: list[str], fraction: bool) -> str:
    head = "\n".join(imports) + "\n" + code + "\n\n"
    return head if fraction else head + "\n".join(asserts) + "\n"


def _stdio_cases(row: Row) -> list[tuple[str, str]] | None:
    value = row.get("input_output")
    if not is_missing(value) and value is not None:
        data = json.loads(value) if isinstance(value, str) else value
        return list(zip([_text(x) for x in data.get("inputs", [])], [_text(x) for x in data.get("outputs", [])]))
    value = row.get("test_cases")
    if not is_missing(value) and value is not None:
        data = json.loads(value) if isinstance(value, str) else value
        return [(_text(case.get("input")), _text(case.get("output"))) for case in data]
    return None


def _text(value) -> str:
    if isinstance(value, list):
        return "\n".join(str(v) for v in value)
    return "" if value is None else str(value)


def _same_output(actual: str, expected: str) -> bool:
    """Whitespace-tolerant stdout comparison: trailing spaces per line and blank edges ignored."""
    def norm(s: str) -> list[str]:
        return [line.rstrip() for line in s.strip().splitlines()]

    return norm(actual) == norm(expected)


class CodeExecutionReward(RewardFunction):
    """1.0 pass / 0.0 fail (or the passed fraction with `pass_fraction=True`); None for rows with no tests."""

    def __init__(
        self,
        workers: int = 2,
        pass_fraction: bool = False,
        timeout_s: float = 10.0,
        memory_mb: int = 1024,
        only_label: str | None = None,
        isolation: str = "auto",
        prompt_imports: bool = False,
    ):
        self.workers = workers
        self.pass_fraction = pass_fraction
        self.timeout_s = timeout_s
        self.memory_mb = memory_mb
        self.isolation = isolation
        self.prompt_imports = prompt_imports
        self.name = "code_execution"
        super().__init__(only_label=only_label)

    @property
    def sandbox_config(self) -> SandboxConfig:
        cpu = max(1, int(self.timeout_s))
        return SandboxConfig(timeout_s=self.timeout_s, cpu_s=cpu, memory_mb=self.memory_mb, isolation=self.isolation)

    def jobs_for(self, index: int, code: str, row: Row) -> list[_Job] | None:
        marker = f"RUFUS-PASS-{secrets.token_hex(8)}"
        if not is_missing(row.get("test")) and not is_missing(row.get("entry_point")):
            return [_Job(index, _humaneval_source(code, row["test"], row["entry_point"]), marker=marker)]
        test_list = row.get("test_list")
        if test_list is not None and not isinstance(test_list, str) and len(test_list) > 0:
            imports = [str(x) for x in (row.get("test_imports") if row.get("test_imports") is not None else [])]
            asserts = [str(x) for x in test_list]
            program = _mbpp_source(code, imports, asserts, self.pass_fraction)
            return [_Job(index, program, marker=marker, asserts=asserts if self.pass_fraction else [])]
        cases = _stdio_cases(row)
        if cases:
            return [_Job(index, code, stdin=given, expected=want) for given, want in cases]
        return None

    def score_rows(self, prompts, texts, closed, rows, log_metric):
        scores: list[float | None] = [None] * len(texts)
        jobs: list[_Job] = []
        for index, (prompt, text, ok, row) in enumerate(zip(prompts, texts, closed, rows)):
            code = extract_code(text)
            if self.prompt_imports and (imports := prompt_import_lines(prompt)):
                code = f"{imports}\n{code}"
            if not is_missing(prelude := row.get("code_prelude")):
                code = f"{prelude}\n{code}"
            row_jobs = self.jobs_for(index, code, row)
            if row_jobs is None:
                continue
            if not ok:
                scores[index] = 0.0
                continue
            jobs.extend(row_jobs)
        results = run_many([job.sandbox_job() for job in jobs], self.sandbox_config, self.workers)
        passed: dict[int, list[float]] = {}
        for job, result in zip(jobs, results):
            passed.setdefault(job.completion, []).append(self.job_score(job, result))
        for index, values in passed.items():
            if self.pass_fraction:
                scores[index] = sum(values) / len(values)
            else:
                scores[index] = 1.0 if all(v == 1.0 for v in values) else 0.0
        if log_metric is not None and results:
            log_metric("code_execution/timeouts", float(sum(r.timed_out for r in results)))
            log_metric("code_execution/output_capped", float(sum(r.output_truncated for r in results)))
        return scores

    def job_score(self, job: _Job, result: SandboxResult) -> float:
        if job.expected is not None:
            return 1.0 if result.ok and _same_output(result.stdout, job.expected) else 0.0
        lines = result.stdout.splitlines()
        if job.asserts:  # fraction mode: one marker line per passed assert
            if result.timed_out or result.output_truncated:
                return 0.0
            return sum(f"{job.marker}:{i}" in lines for i in range(len(job.asserts))) / len(job.asserts)
        return 1.0 if result.ok and job.marker in lines else 0.0
