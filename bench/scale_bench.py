"""How the data path scales: `mix`, `decontam --against quick` and `dedup` on N distinct rows
made from real data, at three sizes, each step its own process; prints rows/s, peak RSS and the
growth exponent of time and memory with N (the slope of log time or log memory against log N),
and plots them.

The rows: GSM8K train and Code Alpaca 2k (under $RUFUS_DATA_ROOT), cycled to N rows, every row
given a unique preamble and every fourth word of its text swapped for a word drawn for that row,
so no two rows share enough shingles to be near duplicates (as in a real set, where distinct
rows share almost none); then one row in a hundred is planted as an exact copy of an earlier
row, which dedup should drop. They are written as a shard folder (what decontam and dedup read)
and as one parquet file per source (what mix reads), and kept in the bench folder for the next run.

    python bench/scale_bench.py [--rows 250000,1000000,2000000] [--steps mix,decontam,dedup]
                                [--out outputs/scale_bench] [--workers N]

Time is wall time of the command (its process start included), with rows per CPU-second of all
its processes beside it (the steadier figure on a shared machine); peak RSS is the largest
process's (as /usr/bin/time reports it) and, sampled every 0.2 s, the sum over the command and
its worker processes. Targets (issue 26): dedup >= 40k rows/s on 2 cores and flat
memory; every step's time exponent <= 1.1 and memory exponent <= 0.3."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from rufus_data.base.jsonl import read_jsonl
from rufus_data.base.paths import data_root
from rufus_data.base.report import pyplot
from rufus_data.folders.shards import write_shard

STEPS = ("mix", "decontam", "dedup")
SHARD_ROWS = 50_000
PLANTED_EVERY = 100  # one row in this many is an exact copy of an earlier row
SWAPPED_EVERY = 4  # one word in this many is swapped for a word drawn for the row
TIME_EXPONENT, MEMORY_EXPONENT, DEDUP_ROWS_S = 1.1, 0.3, 40_000
BUILD = 3  # the version of make_rows: data built by another is built again


def base_rows(root: Path) -> list[tuple[str, str, str]]:
    """(source, user turn, assistant turn) of every GSM8K train and Code Alpaca 2k row with a reply:
    two Code Alpaca rows have an empty output, which mix rightly refuses to train on."""
    rows = [("gsm8k", r["question"], r["answer"]) for r in read_jsonl(root / "gsm8k" / "train.jsonl")]
    rows += [("code_alpaca", r["instruction"] + (f"\n{r['input']}" if r["input"] else ""), r["output"])
             for r in read_jsonl(root / "code_alpaca_2k" / "code_alpaca_2k.jsonl")]
    return [row for row in rows if row[2].strip()]


def make_rows(bases: list[tuple[str, str, str]], first: int, count: int) -> pa.Table:
    """Rows first..first+count-1 of the bench set (the same rows for the same numbers, whatever
    the chunk): row i is base i mod len(bases), made distinct (module docstring) with words
    drawn by a hash of the row and the word's place; a planted row is the exact text of an
    earlier row under its own id."""
    vocabulary = sorted({w for _, q, a in bases[:500] for w in (q + " " + a).split() if w.isalpha()})
    split = [(source, user.split(" "), assistant.split(" ")) for source, user, assistant in bases]
    copied = copied_rows(np.arange(first, first + count))
    places = 8 + max(len(u) + len(a) for _, u, a in split) // SWAPPED_EVERY  # the draws a row can need
    with np.errstate(over="ignore"):
        draws = _mix64(copied.astype(np.uint64)[:, None] * np.uint64(places) + np.arange(places, dtype=np.uint64)) % np.uint64(len(vocabulary))
    sources, contents = [], []
    for copy_of, drawn in zip(copied.tolist(), draws.tolist()):
        source, user, assistant = split[copy_of % len(bases)]
        picks = iter(drawn)
        turns = []
        for words in (list(user), list(assistant)):
            for k in range(next(picks) % SWAPPED_EVERY, len(words), SWAPPED_EVERY):
                words[k] = vocabulary[next(picks)]
            turns.append(" ".join(words))
        sources.append(source)
        contents += [f"Request {copy_of}, {vocabulary[next(picks)]} {vocabulary[next(picks)]}: {turns[0]}", turns[1]]
    turns = pa.StructArray.from_arrays([pa.array(["user", "assistant"] * count), pa.array(contents)], names=["role", "content"])
    return pa.table({"id": [f"r{i}" for i in range(first, first + count)], "source": sources, "label": sources,
                     "messages": pa.ListArray.from_arrays(pa.array(np.arange(0, 2 * count + 1, 2, dtype=np.int32)), turns)})


def _mix64(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser: well-spread pseudo-random numbers from counters."""
    with np.errstate(over="ignore"):
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


def copied_rows(rows: np.ndarray) -> np.ndarray:
    """The row whose text each row has: itself, or for a planted row an earlier row that is not planted."""
    planted = rows % PLANTED_EVERY == PLANTED_EVERY - 1
    earlier = rows - 1 - (rows * 7919) % np.maximum(np.minimum(rows, 5000), 1)
    earlier -= earlier % PLANTED_EVERY == PLANTED_EVERY - 1
    return np.where(planted, earlier, rows)


def planted(n: int) -> int:
    return n // PLANTED_EVERY


def build(root: Path, n: int, folder: Path) -> Path:
    """The shard folder (folder/shards) and the per-source files of mix (folder/sources), once."""
    done = folder / "done.json"
    if done.exists() and json.loads(done.read_text()) == {"rows": n, "build": BUILD}:
        return folder
    bases = base_rows(root)
    shards = -(-n // SHARD_ROWS)
    writers: dict[str, pq.ParquetWriter] = {}
    (folder / "sources").mkdir(parents=True, exist_ok=True)
    for index in range(shards):
        table = make_rows(bases, index * SHARD_ROWS, min(SHARD_ROWS, n - index * SHARD_ROWS))
        write_shard(table, folder / "shards", index, shards)
        for source in ("gsm8k", "code_alpaca"):
            part = table.filter(pc.equal(table.column("source"), source)).select(["messages"])
            if source not in writers:
                writers[source] = pq.ParquetWriter(folder / "sources" / f"{source}.parquet", part.schema)
            writers[source].write_table(part)
        print(f"  built {min(n, (index + 1) * SHARD_ROWS):,} of {n:,} rows", end="\r", flush=True)
    for writer in writers.values():
        writer.close()
    (folder / "catalog.yaml").write_text(
        "kind: sft\nname: scale\ntokenizer: smollm2-135m\nseed: 0\nbasis: total\nsources:\n"
        "  - {name: gsm8k, path: sources/gsm8k.parquet, format: messages, share: 0.5}\n"
        "  - {name: code_alpaca, path: sources/code_alpaca.parquet, format: messages, share: 0.5}\n")
    done.write_text(json.dumps({"rows": n, "build": BUILD}))
    print()
    return folder


def step_command(step: str, data: Path, out: Path, workers: int | None) -> list[str]:
    cli = [sys.executable, "-c", "from rufus_data.cli import app; app()"]
    extra = ["--workers", str(workers)] if workers is not None and step != "mix" else []
    if step == "mix":
        return [*cli, "mix", str(data / "catalog.yaml"), "--out", str(out), "--overwrite"]
    if step == "decontam":
        return [*cli, "decontam", str(data / "shards"), "--against", "quick", "--out", str(out), "--overwrite", *extra]
    return [*cli, "dedup", str(data / "shards"), "--out", str(out), "--overwrite", *extra]


# Runs the command and writes its peak RSS: a fresh, small process starts it, since a child's peak
# RSS counts the memory of the process it was forked from (Linux keeps the high-water mark over exec)
LAUNCHER = """
import json, resource, subprocess, sys
done = subprocess.run(sys.argv[2:])
usage = resource.getrusage(resource.RUSAGE_CHILDREN)
with open(sys.argv[1], "w") as fh:
    json.dump({"maxrss_kb": usage.ru_maxrss, "cpu_s": usage.ru_utime + usage.ru_stime}, fh)
sys.exit(done.returncode)
"""


def measure(command: list[str], env: dict, work: Path) -> dict:
    """Run a command: wall seconds, CPU seconds (all its processes: as the kernel counts the
    children reaped, and as sampled every 0.2 s over every process below it, which also counts
    workers of a server process that nobody reaps), the largest process's peak RSS (what
    /usr/bin/time reports) and the peak of the RSS summed over it and its worker processes
    (sampled every 0.2 s)."""
    try:
        import psutil  # comes with the train extra; without it the sum over workers is not sampled
    except ImportError:
        psutil = None

    usage_file = work / "usage.json"
    start = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-c", LAUNCHER, str(usage_file), *command], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    peak_tree = 0
    cpu_by_process: dict[int, float] = {}  # the last CPU seconds seen of each process below the launcher
    stop = threading.Event()

    def sample() -> None:
        nonlocal peak_tree
        if psutil is None:
            return
        try:
            launcher = psutil.Process(proc.pid)
            while not stop.is_set():
                total = 0
                for p in launcher.children(recursive=True):
                    try:
                        total += p.memory_info().rss
                        times = p.cpu_times()
                        cpu_by_process[p.pid] = times.user + times.system
                    except psutil.Error:
                        pass
                peak_tree = max(peak_tree, total)
                stop.wait(0.2)
        except psutil.Error:
            return

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    output = proc.stdout.read().decode(errors="replace")
    proc.wait()
    seconds = time.perf_counter() - start
    stop.set()
    sampler.join()
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed ({proc.returncode}):\n{output[-3000:]}")
    usage = json.loads(usage_file.read_text())
    return {"seconds": seconds, "cpu_seconds": usage["cpu_s"], "sampled_cpu_seconds": sum(cpu_by_process.values()),
            "peak_rss_mb": usage["maxrss_kb"] / 1024, "peak_tree_mb": peak_tree / 2**20, "output": output}


def exponent(sizes: list[int], values: list[float]) -> float:
    """The slope of log(value) against log(rows): 1 is linear, 0 is flat."""
    return float(np.polyfit(np.log(sizes), np.log(values), 1)[0]) if len(sizes) > 1 else float("nan")


def plot(results: dict, sizes: list[int], path: Path) -> None:
    plt = pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    peaks = []
    for step, runs in results.items():
        ns = [n for n in sizes if n in runs]
        left.loglog(ns, [runs[n]["seconds"] for n in ns], "o-", label=step)
        right.loglog(ns, [runs[n]["peak_rss_mb"] for n in ns], "o-", label=step)
        peaks += [runs[n]["peak_rss_mb"] for n in ns]
    if sizes:  # what linear time would look like, from the first size of the slowest step
        first = max(runs[sizes[0]]["seconds"] for runs in results.values())
        left.loglog(sizes, [first * n / sizes[0] for n in sizes], ":", color="grey", label="linear")
    left.set(xlabel="rows", ylabel="seconds", title="time (log-log: slope = exponent)")
    right.set(xlabel="rows", ylabel="peak RSS, largest process (MB)", title="memory (flat is the target)")
    if peaks:
        right.set_ylim(min(peaks) / 4, max(peaks) * 4)  # a decade or more: a flat line looks flat
    for ax in (left, right):
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", default="250000,1000000,2000000", help="comma-separated sizes")
    parser.add_argument("--steps", default=",".join(STEPS), help="comma-separated: mix,decontam,dedup")
    parser.add_argument("--out", type=Path, default=REPO / "outputs" / "scale_bench", help="bench folder (data is kept)")
    parser.add_argument("--workers", type=int, default=None, help="--workers of decontam and dedup (default: theirs)")
    args = parser.parse_args()
    sizes = sorted(int(float(s)) for s in args.rows.split(","))
    steps = [s for s in args.steps.split(",") if s]
    unknown = set(steps) - set(STEPS)
    if unknown:
        raise SystemExit(f"unknown steps {sorted(unknown)}: choose from {', '.join(STEPS)}")
    root = data_root()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    results: dict[str, dict[int, dict]] = {s: {} for s in steps}
    print(f"scale bench: {', '.join(f'{n:,}' for n in sizes)} rows; {os.cpu_count()} CPUs; load {os.getloadavg()[0]:.1f}")
    for n in sizes:
        data = build(root, n, args.out / f"data-{n}")
        for step in steps:
            out = args.out / f"{step}-{n}"
            run = measure(step_command(step, data, out, args.workers), env, args.out)
            run["rows_s"] = n / run["seconds"]
            if step == "dedup":
                manifest = json.loads((out / "manifest.json").read_text())
                run["dropped"] = manifest["counts"]["rows_dropped"]
            results[step][n] = run
            shutil.rmtree(out)  # the outputs are as large as the data
            extra = f", dropped {run['dropped']:,} (planted {planted(n):,})" if step == "dedup" else ""
            print(f"  {step:<9} {n:>10,} rows: {run['seconds']:8.1f} s, {run['rows_s']:>9,.0f} rows/s "
                  f"({n / run['cpu_seconds']:,.0f} per CPU-second), peak RSS {run['peak_rss_mb']:,.0f} MB "
                  f"(all processes {run['peak_tree_mb']:,.0f} MB){extra}; load {os.getloadavg()[0]:.1f}", flush=True)

    print(f"\n| step | {' | '.join(f'{n:,} rows' for n in sizes)} | time exponent | memory exponent |")
    print(f"|---|{'---|' * len(sizes)}---|---|")
    ok = True
    summary = {}
    for step, runs in results.items():
        time_exp = exponent(sizes, [runs[n]["seconds"] for n in sizes])
        memory_exp = exponent(sizes, [runs[n]["peak_rss_mb"] for n in sizes])
        cells = [f"{runs[n]['seconds']:.1f} s ({runs[n]['rows_s'] / 1000:,.1f}k rows/s, {n / runs[n]['cpu_seconds'] / 1000:,.1f}k "
                 f"per CPU-s), {runs[n]['peak_rss_mb'] / 1024:.2f} GB ({runs[n]['peak_tree_mb'] / 1024:.2f} GB all)" for n in sizes]
        print(f"| `{step}` | {' | '.join(cells)} | {time_exp:.2f} | {memory_exp:.2f} |")
        ok &= time_exp <= TIME_EXPONENT and memory_exp <= MEMORY_EXPONENT
        if step == "dedup":
            ok &= runs[sizes[-1]]["rows_s"] >= DEDUP_ROWS_S
        summary[step] = {"time_exponent": time_exp, "memory_exponent": memory_exp,
                         "runs": {n: {k: v for k, v in r.items() if k != "output"} for n, r in runs.items()}}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "scale_bench.json").write_text(json.dumps(summary, indent=2))
    plot(results, sizes, args.out / "scale_bench.png")
    print(f"\ntargets: dedup >= {DEDUP_ROWS_S:,} rows/s at {sizes[-1]:,} rows; time exponent <= {TIME_EXPONENT}, "
          f"memory exponent <= {MEMORY_EXPONENT} for every step")
    print("targets met" if ok else "TARGETS MISSED")
    print(f"wrote {args.out / 'scale_bench.json'} and {args.out / 'scale_bench.png'}")


if __name__ == "__main__":
    main()
