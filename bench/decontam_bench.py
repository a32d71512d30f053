"""Rows/s of `rufus-data decontam` (exact 8-grams + MinHash, local processes) against two
baselines on the same rows, in one run:

  - a per-row datasketch loop: `MinHash.update` once per shingle (the textbook usage);
  - a plain exact 8-gram set lookup in the style of open-r1's decontamination script
    (lowercase, split on whitespace, join 8 words, look the string up in a set).

Targets (issue 4): >= 10x the per-row datasketch loop, and no slower than the exact-only pass.
Also prints peak RSS. Needs $RUFUS_DATA_ROOT (shared/data)."""

from __future__ import annotations

import json
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

import pyarrow as pa
from datasketch import MinHash

from rufus_data.benchmarks import load_benchmarks
from rufus_data.decontam import DecontamConfig, decontaminate
from rufus_data.paths import data_root
from rufus_data.shards import write_shards

AGAINST = ["gsm8k", "math500", "humaneval", "mbpp", "ifeval"]
REPEAT = int(os.environ.get("DECONTAM_BENCH_REPEAT", "3"))


def load_rows(root: Path) -> list[dict]:
    def jsonl(path):
        with open(root / path) as fh:
            return [json.loads(line) for line in fh]

    rows = []
    for r in jsonl("gsm8k/train.jsonl"):
        rows.append([{"role": "user", "content": r["question"]}, {"role": "assistant", "content": r["answer"]}])
    for r in jsonl("code_alpaca_2k/code_alpaca_2k.jsonl"):
        rows.append([{"role": "user", "content": r["instruction"] + ("\n" + r["input"] if r["input"] else "")},
                     {"role": "assistant", "content": r["output"]}])
    for r in jsonl("hh_rlhf_harmless_base/test.jsonl"):
        turns = [t for t in r["chosen"].split("\n\n") if t.strip()]
        rows.append([{"role": "user" if t.startswith("Human:") else "assistant", "content": t.split(":", 1)[-1].strip()}
                     for t in turns])
    rows = rows * REPEAT  # enough rows for the local process pool to pay off (>= 20k rows)
    return [{"id": f"r{i}", "source": "bench", "label": "bench", "messages": m} for i, m in enumerate(rows)]


def cpu_seconds() -> float:
    """CPU time of this process and its finished children: on a shared machine, wall time
    measures the neighbours as much as the code."""
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def openr1_style(rows: list[dict], eval_texts: list[str], n: int = 8) -> tuple[float, int]:
    def normalise(text: str) -> str:
        return " ".join(text.lower().split())

    def ngrams(text: str) -> list[str]:
        words = text.split()
        return [" ".join(words[i : i + n]) for i in range(len(words) - n + 1)]

    start = time.perf_counter()
    lookup = {g for t in eval_texts for g in ngrams(normalise(t))}
    flagged = sum(any(g in lookup for m in row["messages"] for g in ngrams(normalise(m["content"]))) for row in rows)
    return time.perf_counter() - start, flagged


def datasketch_loop(rows: list[dict], k: int = 2, num_perm: int = 64) -> float:
    start = time.perf_counter()
    for row in rows:
        m = MinHash(num_perm=num_perm)
        for msg in row["messages"]:
            words = msg["content"].lower().split()
            for i in range(max(1, len(words) - k + 1)):
                m.update(" ".join(words[i : i + k]).encode())
    return time.perf_counter() - start


def main() -> None:
    rows = load_rows(data_root())
    eval_texts = [p for it in load_benchmarks(AGAINST).items for p in it.problems]
    with tempfile.TemporaryDirectory() as tmp:
        write_shards(pa.Table.from_pylist(rows), Path(tmp) / "mix", shard_rows=4000)
        config = DecontamConfig()
        start = time.perf_counter()
        cold = decontaminate(Path(tmp) / "mix", AGAINST, dry_run=True, config=config, show_progress=False)
        cold_s = time.perf_counter() - start
        start, cpu0 = time.perf_counter(), cpu_seconds()  # the eval index is cached in-process now: the scan itself
        warm = decontaminate(Path(tmp) / "mix", AGAINST, dry_run=True, config=config, show_progress=False)
        warm_s, warm_cpu = time.perf_counter() - start, cpu_seconds() - cpu0
        one = config.model_copy(update={"workers": 1})
        start, cpu0 = time.perf_counter(), cpu_seconds()
        decontaminate(Path(tmp) / "mix", AGAINST, dry_run=True, config=one, show_progress=False)
        one_s, one_cpu = time.perf_counter() - start, cpu_seconds() - cpu0
    cpu0 = cpu_seconds()
    exact_s, exact_flagged = openr1_style(rows, eval_texts)
    exact_cpu = cpu_seconds() - cpu0
    sample = rows[:: max(1, len(rows) // 1500)]
    cpu0 = cpu_seconds()
    loop_s = datasketch_loop(sample) * len(rows) / len(sample)
    loop_cpu = (cpu_seconds() - cpu0) * len(rows) / len(sample)
    n = len(rows)
    workers = config.workers or (min(os.cpu_count() or 1, -(-n // config.batch_rows)) if n >= 20_000 else 1)
    print(f"rows: {n:,} (GSM8K train, Code Alpaca 2k, HH-RLHF harmless test, x{REPEAT}) vs {', '.join(AGAINST)} "
          f"({len(eval_texts):,} eval problems); decontam uses {workers} local processes")
    print(f"{'method':<48}{'rows/s':>12}{'rows/CPU-s':>12}{'flagged rows':>14}")
    print(f"{'rufus decontam, exact+MinHash (scan)':<48}{n / warm_s:>12,.0f}{n / warm_cpu:>12,.0f}{len(warm.flagged_rows):>14,}")
    print(f"{'rufus decontam, same, one process':<48}{n / one_s:>12,.0f}{n / one_cpu:>12,.0f}{'':>14}")
    print(f"{'rufus decontam, incl. building the eval index':<48}{n / cold_s:>12,.0f}{'':>12}{len(cold.flagged_rows):>14,}")
    print(f"{'exact 8-gram set lookup (open-r1 style)':<48}{n / exact_s:>12,.0f}{n / exact_cpu:>12,.0f}{exact_flagged:>14,}")
    print(f"{'datasketch MinHash.update per row (est. on ' + str(len(sample)) + ')':<48}{n / loop_s:>12,.0f}{n / loop_cpu:>12,.0f}{'-':>14}")
    print(f"ratio vs per-row datasketch loop: {loop_s / warm_s:,.1f}x wall (target >= 10x), "
          f"{loop_cpu / warm_cpu:,.1f}x per CPU-second")
    print(f"ratio vs exact-only pass: {exact_s / warm_s:,.2f}x wall (target >= 1.0x), {exact_cpu / warm_cpu:,.2f}x per "
          f"CPU-second; including the index build: {exact_s / cold_s:,.2f}x wall")
    print(f"load average while running: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    print(f"peak RSS: main process {own:,.0f} MiB, largest worker {children:,.0f} MiB")
    sys.exit(0)


if __name__ == "__main__":
    main()
