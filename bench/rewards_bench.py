"""Reward throughput: string-match completions/s per core and sandboxed executions/s (HumanEval).

Each figure is printed with a baseline measured in the same run, so the ratio survives a busy machine:
- string-match vs. the floor of touching each completion once (`str.rfind` of the box marker);
- the sandbox vs. running the same HumanEval programs in a bare `python -I -S` subprocess (no isolation).

    RUFUS_DATA_ROOT=../shared/data .venv/bin/python bench/rewards_bench.py [--workers 2] [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from rufus_data.base.paths import data_root
from rufus_data.rewards import (
    CodeExecutionReward,
    MathEquivalenceReward,
    StringMatchReward,
)
from rufus_data.rewards.code_execution import _humaneval_source
from rufus_data.rewards.sandbox import SandboxConfig, sandbox_python

STRING_MATCH_TARGET = 50_000  # completions/s on one core
SANDBOX_TARGET = 20.0  # executions/s on 2 cores


def read_jsonl(path: Path) -> list[dict]:
    with open(path) as handle:
        return [json.loads(line) for line in handle]


def model_style_completions(rows: list[dict]) -> tuple[list[str], list[str]]:
    """MATH-500 solutions written the way a model answers: reasoning block, the worked solution, a final box."""
    completions, answers = [], []
    for i, row in enumerate(rows):
        final = row["answer"] if i % 4 else row["answer"] + "1"  # a quarter are wrong
        completions.append(f"<think>Let me work through this.\n{row['problem'][:300]}</think>\n{row['solution']}\n"
                           f"So the final answer is $\\boxed{{{final}}}$.")
        answers.append(row["answer"])
    return completions, answers


def cpu_seconds() -> float:
    """CPU time of this process and its finished children (the sandboxes), user + system."""
    import resource

    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def best_rate(count: int, fn, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return count / best


def bench_string_match(root: Path, repeat: int) -> None:
    rows = read_jsonl(root / "math500" / "test.jsonl")
    completions, answers = model_style_completions(rows)
    completions, answers = completions * 20, answers * 20  # 10,000 completions
    reward = StringMatchReward("boxed", answer_column="answer")
    scores = reward(completions=completions, answer=answers)
    assert scores.count(1.0) == len(completions) * 3 // 4, "bench completions scored wrongly"
    rate = best_rate(len(completions), lambda: reward(completions=completions, answer=answers), repeat)
    floor = best_rate(len(completions), lambda: [c.rfind("\\boxed") for c in completions], repeat)
    math_reward = MathEquivalenceReward(answer_column="answer")
    subset = 200
    math_rate = best_rate(subset, lambda: math_reward(completions=completions[:subset], answer=answers[:subset]), 1)
    mean_chars = sum(map(len, completions)) / len(completions)
    print(f"\nstring_match:boxed on {len(completions):,} MATH-500-style completions (mean {mean_chars:,.0f} chars), 1 core")
    print(f"  string_match      {rate:>12,.0f} completions/s   target {STRING_MATCH_TARGET:,}  -> {rate / STRING_MATCH_TARGET:.2f}x target")
    print(f"  baseline rfind    {floor:>12,.0f} completions/s   string_match costs {floor / rate:.1f}x the floor")
    print(f"  math_equivalence  {math_rate:>12,.0f} completions/s   ({rate / math_rate:,.0f}x slower than string_match)")


def bench_sandbox(root: Path, workers: int, repeat: int) -> None:
    rows = read_jsonl(root / "humaneval" / "HumanEval.jsonl")
    completions = [row["prompt"] + row["canonical_solution"] for row in rows]
    columns = {"test": [r["test"] for r in rows], "entry_point": [r["entry_point"] for r in rows]}
    reward = CodeExecutionReward(workers=workers)
    assert reward(completions=completions, **columns) == [1.0] * len(rows), "canonical solutions must pass"
    cpu_before = cpu_seconds()
    rate = best_rate(len(rows), lambda: reward(completions=completions, **columns), repeat)
    cpu_per_run = (cpu_seconds() - cpu_before) / (len(rows) * repeat)
    programs = [_humaneval_source(c, r["test"], r["entry_point"]) for c, r in zip(completions, rows)]
    python = sandbox_python(SandboxConfig())

    def bare(program: str) -> int:
        return subprocess.run([python, "-I", "-S", "-c", program], capture_output=True, timeout=30, check=False).returncode

    def run_bare():
        with ThreadPoolExecutor(workers) as pool:
            assert list(pool.map(bare, programs)) == [0] * len(programs)

    cpu_before = cpu_seconds()
    bare_rate = best_rate(len(rows), run_bare, repeat)
    bare_cpu_per_run = (cpu_seconds() - cpu_before) / (len(rows) * repeat)
    isolation = reward.sandbox_config
    from rufus_data.rewards.sandbox import effective_isolation

    print(f"\ncode_execution on {len(rows)} HumanEval canonical solutions, {workers} workers "
          f"(isolation: {effective_isolation(isolation)}, {len(os.sched_getaffinity(0))} cores visible, "
          f"load {os.getloadavg()[0]:.1f})")
    print(f"  sandbox           {rate:>8.1f} executions/s   target {SANDBOX_TARGET:.0f}/s  -> {rate / SANDBOX_TARGET:.2f}x target")
    print(f"  baseline bare     {bare_rate:>8.1f} executions/s   (no isolation) sandbox overhead {bare_rate / rate:.2f}x")
    print(f"  CPU per execution: sandbox {cpu_per_run * 1000:.1f} ms, bare {bare_cpu_per_run * 1000:.1f} ms "
          f"({cpu_per_run / bare_cpu_per_run:.2f}x); on {workers} idle cores that is at most "
          f"{workers / cpu_per_run:.0f} sandboxed executions/s ({workers / cpu_per_run / SANDBOX_TARGET:.1f}x target)")
    more = 2 * workers
    reward_more = CodeExecutionReward(workers=more)
    rate_more = best_rate(len(rows), lambda: reward_more(completions=completions, **columns), 1)
    print(f"  sandbox, {more} workers {rate_more:>6.1f} executions/s   (runs wait on the kernel's namespace set-up and "
          "tear-down as well as on CPU, so more workers than cores helps)")
    cores = len(os.sched_getaffinity(0))
    if os.getloadavg()[0] > cores:
        print(f"  note: the machine is busy (load {os.getloadavg()[0]:.1f} on {cores} cores), so the wall-clock rates "
              "understate; the CPU-per-execution line does not depend on the load")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    root = data_root()
    print(f"python {sys.version.split()[0]}, pid {os.getpid()}")
    bench_string_match(root, args.repeat)
    bench_sandbox(root, args.workers, args.repeat)


if __name__ == "__main__":
    main()
