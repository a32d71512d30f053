"""Rows/s of `rufus-data decontam` (exact 8-grams + MinHash, local processes) against two
baselines on the same rows, in one run:

  - a plain exact 8-gram set lookup in the style of open-r1's decontamination script
    (lowercase, split on whitespace, join 8 words, look the string up in a set), timed with
    the building of its set of the eval problems' 8-grams;
  - a per-row datasketch loop: `MinHash.update` once per shingle (the textbook usage).

decontam is timed as a command runs it (loading the benchmarks, then the eval index, then the
scan), with nothing in the process's memory, two ways: cold, `$RUFUS_CACHE` empty, so it builds
the eval index and stores it; warm, the index read from `$RUFUS_CACHE` where the cold run left
it: the normal run, every command after the first against the same benchmarks and settings.
Also the scan alone (the index in memory). DECONTAM_BENCH_RUNS (5) runs of each, interleaved,
so a burst of load elsewhere on the machine hits all of them; ratios are taken run by run and
their median printed with the range.

Targets: warm >= 1.5x the exact pass with its set (issue 26; cold printed beside it), >= 10x the
per-row datasketch loop. Also prints peak RSS. Needs $RUFUS_DATA_ROOT (shared/data)."""

from __future__ import annotations

import json
import os
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

import pyarrow as pa
from datasketch import MinHash

from rufus_data.base.paths import data_root
from rufus_data.benchmarks import load_benchmarks
from rufus_data.decontam import DecontamConfig, decontam
from rufus_data.decontam import index as eval_index
from rufus_data.folders.shards import write_shards

AGAINST = ["gsm8k", "math500", "humaneval", "mbpp", "ifeval"]
REPEAT = int(os.environ.get("DECONTAM_BENCH_REPEAT", "3"))
RUNS = int(os.environ.get("DECONTAM_BENCH_RUNS", "5"))


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


def timed(fn, *args) -> tuple[float, float, object]:
    """(wall seconds, CPU seconds of this process and its workers, result of fn(*args))."""
    start, cpu0 = time.perf_counter(), cpu_seconds()
    result = fn(*args)
    return time.perf_counter() - start, cpu_seconds() - cpu0, result


def spread(ratios: list[float]) -> str:
    return f"{statistics.median(ratios):.2f}x median ({min(ratios):.2f}-{max(ratios):.2f})"


def main() -> None:
    rows = load_rows(data_root())
    eval_texts = [p for it in load_benchmarks(AGAINST).items for p in it.problems]
    config = DecontamConfig()
    runs: dict[str, list[tuple[float, float, int]]] = {"warm": [], "cold": [], "scan": [], "exact": []}
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "mix"
        write_shards(pa.Table.from_pylist(rows), src, shard_rows=4000)

        def scan(workers: int = 0) -> int:
            one = config.model_copy(update={"workers": workers})
            return len(decontam(src, None, one.model_copy(update={"against": AGAINST}), report_only=True).flagged_rows)

        def command(cache: Path) -> int:
            os.environ["RUFUS_CACHE"] = str(cache)
            eval_index._CACHE.clear()  # a new command: no index in this process's memory
            return scan()

        for run in range(RUNS):
            cache = Path(tmp) / f"cache{run}"  # empty: the cold run builds the index and stores it there
            runs["cold"].append(timed(command, cache))
            runs["warm"].append(timed(command, cache))
            runs["scan"].append(timed(scan))  # the index still in memory
            runs["exact"].append(timed(lambda: openr1_style(rows, eval_texts)[1]))
        one_s, one_cpu, _ = timed(scan, 1)
    sample = rows[:: max(1, len(rows) // 1500)]
    cpu0 = cpu_seconds()
    loop_s = datasketch_loop(sample) * len(rows) / len(sample)
    loop_cpu = (cpu_seconds() - cpu0) * len(rows) / len(sample)
    n = len(rows)
    workers = config.workers or (min(os.cpu_count() or 1, -(-n // config.batch_rows)) if n >= 20_000 else 1)
    print(f"rows: {n:,} (GSM8K train, Code Alpaca 2k, HH-RLHF harmless test, x{REPEAT}) vs {', '.join(AGAINST)} "
          f"({len(eval_texts):,} eval problems); decontam uses {workers} local processes; medians of {RUNS} "
          "interleaved runs")
    print(f"{'method':<58}{'rows/s':>10}{'rows/CPU-s':>12}{'flagged rows':>14}")
    labels = {"warm": "rufus decontam, warm: eval index read from RUFUS_CACHE", "cold": "rufus decontam, cold: "
              "eval index built (cache empty)", "scan": "rufus decontam, scan alone (eval index in memory)",
              "exact": "exact 8-gram set lookup (open-r1 style), with its set"}
    for name, label in labels.items():
        wall, cpu = (statistics.median(r[i] for r in runs[name]) for i in (0, 1))
        print(f"{label:<58}{n / wall:>10,.0f}{n / cpu:>12,.0f}{runs[name][0][2]:>14,}")
    print(f"{'rufus decontam, scan alone, one process':<58}{n / one_s:>10,.0f}{n / one_cpu:>12,.0f}")
    print(f"{'datasketch MinHash.update per row (est. on ' + str(len(sample)) + ')':<58}{n / loop_s:>10,.0f}"
          f"{n / loop_cpu:>12,.0f}")
    for name, label in (("warm", "warm (the normal run; target >= 1.5x)"), ("cold", "cold"), ("scan", "scan alone")):
        wall = [e[0] / r[0] for e, r in zip(runs["exact"], runs[name])]
        cpu = [e[1] / r[1] for e, r in zip(runs["exact"], runs[name])]
        print(f"vs the exact pass with its set, {label}: {spread(wall)} wall, {spread(cpu)} per CPU-second")
    scan_wall, scan_cpu = (statistics.median(r[i] for r in runs["scan"]) for i in (0, 1))
    print(f"vs the per-row datasketch loop (the scan alone): {loop_s / scan_wall:,.1f}x wall (target >= 10x), "
          f"{loop_cpu / scan_cpu:,.1f}x per CPU-second")
    print(f"load average while running: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    print(f"peak RSS: main process {own:,.0f} MiB, largest worker {children:,.0f} MiB")
    sys.exit(0)


if __name__ == "__main__":
    main()
