"""Rufus `dedup` side by side with datatrove's MinHash dedup on the same rows, one after the other.

The rows come from GSM8K train and Code Alpaca 2k (under $RUFUS_DATA_ROOT). Each source row is an
original, kept once; a quarter of them carry one long system prompt they all share (distinct
rows sharing a scaffold). Each GSM8K original also gives two more distinct problems that share
its template: the same wording with other numbers (question and worked answer), and the same
setup with the question reversed (its first number asked for, given the original's result).
One original in four (none of those under the shared system prompt) is numbered, as scraped and
synthetic sets number their rows, and has no clean copy anywhere: it and its two distinct
variants each carry a numbered frame of their own (`[id 4521] ...`, `Problem 12: ...`, `7. ...`,
or a system prompt "You are a helpful assistant. This is conversation 4521 of the tutoring
log."), drawn at random, and so does each of its copies. The other rows are copies of originals,
in turn: of a clean original, under a new six-word preamble, under a new six-word suffix, under a
new system prompt, under an ID, with one word in 25 swapped for another, and exact; of a numbered
one, under each numbered frame in turn, every copy with its own number. All rows are shuffled. A
copy is a duplicate of its original; no two distinct problems are duplicates of each other.

    python bench/dedup_peers.py [--rows 500000] [--workers 2] [--skip-datatrove] [--sweep]

Printed for both: wall time, rows/s, CPU seconds of all its processes, the load when it started
and ended, peak RSS (the largest process, and summed over the command's processes), copies kept
(rows beyond one per distinct problem) and distinct problems lost (every row of it removed), and
the copies kept by kind (rows of a copy kind in a problem that keeps more than one row). Targets (issues 33 and 44): Rufus keeps no more copies than datatrove,
loses no distinct problem, runs at >= 8x datatrove's rows/s at 0.5M rows, and its peak RSS stays
at most 0.5 GB. `--sweep` also prints, on these rows, each verification measure and threshold
(copies kept, problems lost) and the LSH candidate recall of the framed copies by band setting.

datatrove 0.10.1 pins xxhash<4, which would move a pin of constraints.txt, so it lives in its own
venv and runs there as a subprocess (this file, `--datatrove-run`):

    python3 -m venv .venv-datatrove
    .venv-datatrove/bin/pip install "datatrove[processing]==0.10.1" spacy orjson

(`DATATROVE_PYTHON` names another interpreter.) It runs its four MinHash stages at their defaults
(5-grams, 14 buckets of 8 hashes) under `LocalPipelineExecutor`, 2 workers, on the rows split
into 8 JSONL files (its reader gives one task per file)."""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DATATROVE_FILES = 8
COPY_KINDS = ("preamble", "suffix", "system", "id", "swapped", "exact")
NUMBERED_KINDS = ("bracketed_id", "problem_number", "list_number", "system_counter")  # copies of a numbered original
NUMBERED_EVERY = 4  # one original in this many (none under the shared system prompt) is numbered
ALL_COPY_KINDS = COPY_KINDS + NUMBERED_KINDS
SHARED_SYSTEM_EVERY = 4  # one original in this many carries the shared system prompt
SHARED_SYSTEM = (
    "You are a careful, patient and friendly assistant working for an education company. Read every request "
    "twice before you answer it. Think step by step, show the intermediate steps of any computation, and state "
    "the final answer on its own line at the end. When the request asks for code, write complete, runnable code "
    "with short comments, prefer the standard library, name variables so that a reader understands them without "
    "comments, and mention the time complexity where it matters. Never invent facts: if something is unknown, "
    "say so plainly. Keep a neutral tone, avoid jargon that a student would not know, and do not repeat the "
    "question back to the user. Format lists with dashes and keep paragraphs short so that the answer reads "
    "well on a phone screen.")
_NUMBER = re.compile(r"\d+")


# ---- the rows ---------------------------------------------------------------------------------

def _with_other_numbers(text: str, shift: int) -> str:
    return _NUMBER.sub(lambda m: str(int(m.group()) + shift), text)


def _reversed(question: str, answer: str) -> tuple[str, str] | None:
    """The same setup asking for its first number, given the original's result."""
    sentences = re.split(r"(?<=[.?!])\s+", question.strip())
    first = _NUMBER.search(question)
    final = answer.rsplit("####", 1)[-1].strip()
    if len(sentences) < 2 or not first or not final:
        return None
    setup = " ".join(sentences[:-1])
    setup = setup[: first.start()] + "some" + setup[first.end():] if first.start() < len(setup) else setup
    return (f"{setup} The answer to '{sentences[-1]}' is {final}. What number was replaced by 'some'?",
            f"Working backwards from {final}, the missing number is {first.group()}.\n#### {first.group()}")


def _distinct_bases(bases: list[tuple[str, str, str]]) -> list[tuple[str, str, str]]:
    """The source rows less the sources' own duplicates, which no method should keep apart:
    GSM8K problems told apart only by a name (the same words but the capitalised ones, the same
    answer) and Code Alpaca tasks asked twice with the same code."""
    seen, kept = set(), []
    for source, user, assistant in bases:
        key = (assistant.strip() if source == "code_alpaca" else
               (" ".join(w for w in user.lower().split() if w not in _names(user)), assistant.rsplit("####", 1)[-1].strip()))
        if key not in seen:
            seen.add(key)
            kept.append((source, user, assistant))
    return kept


def _names(text: str) -> set[str]:
    return {w.lower() for w in text.split() if w[:1].isupper()}


def numbered(row: dict, kind: str, rng: random.Random) -> dict:
    """The row's problem (`user`, `system` unframed) under a numbered frame of `kind`, with a number of its own."""
    number = rng.randrange(1, 100_000)
    user, system = row["user"], row["system"]
    if kind == "bracketed_id":
        user = f"[id {number}] {user}"
    elif kind == "problem_number":
        user = f"Problem {number}: {user}"
    elif kind == "list_number":
        user = f"{number % 1000 + 1}. {user}"
    else:
        system = f"You are a helpful assistant. This is conversation {number} of the tutoring log."
    return {**row, "framed_user": user, "framed_system": system}


def build_rows(n: int, seed: int = 0) -> list[dict]:
    """n rows (module docstring): each with `group` (its distinct problem) and `kind`."""
    sys.path.insert(0, str(REPO / "bench"))
    from scale_bench import base_rows

    from rufus_data.base.paths import data_root

    rng = random.Random(seed)
    bases = _distinct_bases(base_rows(data_root()))
    vocabulary = sorted({w for _, q, a in bases[:500] for w in (q + " " + a).split() if w.isalpha()})
    distinct: list[dict] = []
    originals: list[dict] = []
    for i, (source, user, assistant) in enumerate(bases):
        system = SHARED_SYSTEM if i % SHARED_SYSTEM_EVERY == 0 else None
        framed = i % NUMBERED_EVERY == 1  # numbered: every row of this problem under a numbered frame of its own

        def add(kind: str, user: str, assistant: str, system: str | None = None, framed: bool = framed, source: str = source) -> dict:
            row = {"group": len(distinct), "kind": f"numbered_{kind}" if framed else kind, "source": source,
                   "system": system, "user": user, "assistant": assistant}
            distinct.append(numbered(row, rng.choice(NUMBERED_KINDS), rng) if framed else row)
            return row

        originals.append(add("shared_system" if system else "original", user, assistant, system))
        if source == "gsm8k":
            shift = rng.randint(1, 9)
            add("other_numbers", _with_other_numbers(user, shift), _with_other_numbers(assistant, shift))
            flipped = _reversed(user, assistant)
            if flipped:
                add("reversed", *flipped)
    if n < len(distinct):
        raise SystemExit(f"--rows must be at least {len(distinct):,} (the distinct rows)")
    rows = list(distinct)
    for k in range(n - len(distinct)):
        base = originals[rng.randrange(len(originals))]
        if base["kind"].startswith("numbered"):
            rows.append(numbered({**base, "kind": NUMBERED_KINDS[k % len(NUMBERED_KINDS)]}, NUMBERED_KINDS[k % len(NUMBERED_KINDS)], rng))
            continue
        kind = COPY_KINDS[k % len(COPY_KINDS)]
        words = lambda count: " ".join(rng.choice(vocabulary) for _ in range(count))
        copy = {**base, "kind": kind}
        if kind == "preamble":
            copy["user"] = f"{words(6)}\n{base['user']}"
        elif kind == "suffix":
            copy["user"] = f"{base['user']}\n{words(6)}"
        elif kind == "system":
            copy["system"] = words(12) + "."
        elif kind == "id":
            copy["user"] = f"[ID {rng.randrange(10**6, 10**7)}] {base['user']}"
        elif kind == "swapped":
            turns = []
            for text in (base["user"], base["assistant"]):
                tokens = text.split(" ")
                for at in range(rng.randrange(25), len(tokens), 25):
                    if tokens[at].isalpha():
                        tokens[at] = rng.choice(vocabulary)
                turns.append(" ".join(tokens))
            copy["user"], copy["assistant"] = turns
        rows.append(copy)
    rng.shuffle(rows)
    for i, row in enumerate(rows):
        row["id"] = f"r{i}"
    return rows


def messages(row: dict) -> list[dict]:
    system, user = row.get("framed_system", row["system"]), row.get("framed_user", row["user"])
    turns = [{"role": "system", "content": system}] if system else []
    return turns + [{"role": "user", "content": user}, {"role": "assistant", "content": row["assistant"]}]


def write_inputs(rows: list[dict], folder: Path) -> None:
    """The shard folder Rufus reads and the JSONL files datatrove reads (the turns joined)."""
    import pyarrow as pa

    from rufus_data.folders.shards import write_shards

    table = pa.Table.from_pylist([{"id": r["id"], "source": r["source"], "label": r["source"], "messages": messages(r)}
                                  for r in rows])
    write_shards(table, folder / "shards", shard_rows=50_000)
    (folder / "jsonl").mkdir(parents=True)
    per_file = -(-len(rows) // DATATROVE_FILES)
    for f in range(DATATROVE_FILES):
        with open(folder / "jsonl" / f"part-{f:02d}.jsonl", "w") as fh:
            fh.writelines(json.dumps({"id": r["id"], "text": "\n".join(t["content"] for t in messages(r))}) + "\n" for r in rows[f * per_file : (f + 1) * per_file])
    (folder / "truth.json").write_text(json.dumps({r["id"]: [r["group"], r["kind"]] for r in rows}))


def copies_by_kind(kept_ids: set[str], truth: dict[str, list]) -> dict[str, int]:
    """Kept rows of each copy kind in the problems that keep more than one row."""
    kept_per_group: dict[int, int] = {}
    for rid, (group, _) in truth.items():
        kept_per_group[group] = kept_per_group.get(group, 0) + (rid in kept_ids)
    found: dict[str, int] = {}
    for rid, (group, kind) in truth.items():
        if rid in kept_ids and kind in ALL_COPY_KINDS and kept_per_group[group] > 1:
            found[kind] = found.get(kind, 0) + 1
    return found


def score(kept_ids: set[str], truth: dict[str, list]) -> tuple[int, int, dict[str, int]]:
    """(copies kept, distinct problems lost, problems lost by kind)."""
    kept_per_group: dict[int, int] = {}
    kind_of_group: dict[int, str] = {}
    for rid, (group, kind) in truth.items():
        kept_per_group.setdefault(group, 0)
        if kind not in ALL_COPY_KINDS:
            kind_of_group[group] = kind
        if rid in kept_ids:
            kept_per_group[group] += 1
    lost = [g for g, k in kept_per_group.items() if k == 0]
    by_kind: dict[str, int] = {}
    for g in lost:
        by_kind[kind_of_group[g]] = by_kind.get(kind_of_group[g], 0) + 1
    return sum(max(k - 1, 0) for k in kept_per_group.values()), len(lost), by_kind


# ---- the two runs -----------------------------------------------------------------------------

def with_load(run, *args) -> tuple[dict, set[str]]:
    """A run's stats and kept ids, with the machine's 1-minute load when it started and ended (the
    cores are shared: a wall time means little without it)."""
    start = os.getloadavg()[0]
    stats, kept = run(*args)
    return {**stats, "load": (start, os.getloadavg()[0])}, kept


def run_rufus(folder: Path, workers: int, env: dict, extra: tuple[str, ...] = ()) -> tuple[dict, set[str]]:
    import pyarrow.parquet as pq
    from scale_bench import measure

    out = folder / "rufus_out"
    command = [sys.executable, "-c", "from rufus_data.cli import app; app()", "dedup", str(folder / "shards"),
               "--out", str(out), "--overwrite", "--workers", str(workers), *extra]
    stats = measure(command, env, folder)
    kept = set()
    for path in sorted((out / "data").glob("*.parquet")):
        kept |= set(pq.read_table(path, columns=["id"]).column("id").to_pylist())
    return stats, kept


def run_datatrove(folder: Path, workers: int, env: dict) -> tuple[dict, set[str]]:
    import gzip

    from scale_bench import measure

    python = os.environ.get("DATATROVE_PYTHON", str(REPO / ".venv-datatrove" / "bin" / "python"))
    if not Path(python).exists():
        raise SystemExit(f"datatrove's interpreter {python} is missing: make the venv (module docstring) or set DATATROVE_PYTHON")
    stats = measure([python, __file__, "--datatrove-run", str(folder), "--workers", str(workers)], env, folder)
    kept = set()
    for path in (folder / "datatrove" / "output").glob("*"):
        with gzip.open(path, "rt") as fh:
            kept |= {json.loads(line)["id"] for line in fh}
    return stats, kept


def datatrove_pipeline(folder: Path, workers: int) -> None:
    """datatrove's four MinHash stages at their defaults (runs in datatrove's venv)."""
    from datatrove.executor import LocalPipelineExecutor
    from datatrove.pipeline.dedup import (
        MinhashDedupBuckets,
        MinhashDedupCluster,
        MinhashDedupFilter,
        MinhashDedupSignature,
    )
    from datatrove.pipeline.dedup.minhash import MinhashConfig
    from datatrove.pipeline.readers import JsonlReader
    from datatrove.pipeline.writers.jsonl import JsonlWriter

    config = MinhashConfig()
    base, data = folder / "datatrove", str(folder / "jsonl")
    shutil.rmtree(base, ignore_errors=True)

    def executor(name: str, pipeline: list, tasks: int) -> LocalPipelineExecutor:
        return LocalPipelineExecutor(pipeline=pipeline, tasks=tasks, workers=min(workers, tasks),
                                     logging_dir=str(base / "logs" / name))

    executor("signatures", [JsonlReader(data), MinhashDedupSignature(output_folder=str(base / "sigs"), config=config)],
             DATATROVE_FILES).run()
    executor("buckets", [MinhashDedupBuckets(input_folder=str(base / "sigs"), output_folder=str(base / "buckets"), config=config)],
             config.num_buckets).run()
    executor("clusters", [MinhashDedupCluster(input_folder=str(base / "buckets"), output_folder=str(base / "remove"), config=config)],
             1).run()
    executor("filter", [JsonlReader(data), MinhashDedupFilter(input_folder=str(base / "remove")),
                        JsonlWriter(str(base / "output"))], DATATROVE_FILES).run()


# ---- the sweep: measures and thresholds, candidate recall -----------------------------------

def sweep(folder: Path, rows: list[dict], workers: int, env: dict) -> None:
    truth = json.loads((folder / "truth.json").read_text())
    print("\nverification, on these rows (LSH bands as each measure's default):")
    print("| measure | threshold | numbers must match | copies kept | problems lost (by kind) |\n|---|---:|---|---:|---|")
    for measure, threshold, numbers in (("jaccard", 0.8, False), ("jaccard", 0.7, False), ("containment", 0.9, False),
                                        ("containment", 0.8, False), ("containment", 0.9, True), ("containment", 0.8, True),
                                        ("containment", 0.7, True)):
        config = folder / "sweep.yaml"
        config.write_text(f"measure: {measure}\nthreshold: {threshold}\nnumbers_must_match: {str(numbers).lower()}\n")
        _, kept = run_rufus(folder, workers, env, ("--config", str(config)))
        copies, lost, by_kind = score(kept, truth)
        print(f"| {measure} | {threshold} | {'yes' if numbers else 'no'} | {copies:,} | {lost:,} {by_kind or ''} |")
    candidate_recall(rows)


def candidate_recall(rows: list[dict]) -> None:
    """The share of (copy, its original) pairs that share an LSH band key, by copy kind and band setting."""
    import numpy as np
    import pyarrow as pa

    from rufus_data.dedup.config import LSH_WEIGHTS
    from rufus_data.dedup.signatures import row_shingles
    from rufus_data.similarity.minhash_lsh import BatchMinHasher, band_keys, band_params
    from rufus_data.similarity.ngram_hash import TokenHasher

    first = {}
    for i, r in enumerate(rows):
        if r["kind"] in ("original", "shared_system", "numbered_original"):
            first[r["group"]] = i
    copies = [i for i, r in enumerate(rows) if r["kind"] in ALL_COPY_KINDS][:20_000]
    pairs = [(first[rows[i]["group"]], i) for i in copies]
    needed = sorted({x for p in pairs for x in p})
    where = {r: k for k, r in enumerate(needed)}
    table = pa.Table.from_pylist([{"messages": messages(rows[i])} for i in needed])
    print("\nLSH candidate recall of copies with their original (128 permutations):")
    print("| shingle | bands aim at Jaccard | b x r | " + " | ".join(ALL_COPY_KINDS) + " |\n|---:|---:|---|" + "---:|" * len(ALL_COPY_KINDS))
    for shingle in (3, 2):
        sets = row_shingles(table, shingle, TokenHasher())
        sigs = BatchMinHasher(128, 1).segments(sets.shingles, sets.offsets[:-1])
        for target in (0.65, 0.5, 0.4):
            b, r = band_params(target, 128, LSH_WEIGHTS)
            keys = band_keys(sigs, b, r)
            hit = {k: [0, 0] for k in ALL_COPY_KINDS}
            for o, c in pairs:
                counts = hit[rows[c]["kind"]]
                counts[0] += bool(np.any(keys[where[o]] == keys[where[c]]))
                counts[1] += 1
            print(f"| {shingle} | {target} | {b} x {r} | " + " | ".join(f"{h[0] / max(h[1], 1):.3f}" for h in hit.values()) + " |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=500_000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--out", type=Path, default=REPO / "outputs" / "dedup_peers")
    parser.add_argument("--skip-datatrove", action="store_true")
    parser.add_argument("--sweep", action="store_true", help="also the measures, thresholds and candidate recall")
    parser.add_argument("--datatrove-run", type=Path, help=argparse.SUPPRESS)  # inside datatrove's venv
    args = parser.parse_args()
    if args.datatrove_run:
        datatrove_pipeline(args.datatrove_run, args.workers)
        return
    sys.path.insert(0, str(REPO))
    sys.path.insert(0, str(REPO / "bench"))
    folder = args.out / f"rows-{args.rows}"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    rows = build_rows(args.rows)
    write_inputs(rows, folder)
    truth = json.loads((folder / "truth.json").read_text())
    kinds: dict[str, int] = {}
    for r in rows:
        kinds[r["kind"]] = kinds.get(r["kind"], 0) + 1
    print(f"{len(rows):,} rows: " + ", ".join(f"{k} {v:,}" for k, v in kinds.items()))
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}", "OMP_NUM_THREADS": "1"}
    results = {"Rufus dedup": with_load(run_rufus, folder, args.workers, env)}
    if not args.skip_datatrove:
        results["datatrove 0.10.1"] = with_load(run_datatrove, folder, args.workers, env)
    print(f"\n{len(rows):,} rows, {args.workers} workers\n")
    print("| | " + " | ".join(results) + " |\n|---|" + "---|" * len(results))
    table = {"wall time": [], "CPU time, all processes": [], "load (1 min), start / end": [], "peak RSS, largest process": [],
             "peak RSS, all processes": [], "copies kept": [], "copies kept, by kind": [], "distinct problems lost": []}
    outcome = {}
    for name, (stats, kept) in results.items():
        copies, lost, by_kind = score(kept, truth)
        cpu = max(stats["cpu_seconds"], stats["sampled_cpu_seconds"])
        outcome[name] = (stats["seconds"], cpu, copies, lost, stats["peak_rss_mb"] / 1024)
        table["wall time"].append(f"{stats['seconds']:.1f} s ({len(rows) / stats['seconds'] / 1000:.1f}k rows/s)")
        table["CPU time, all processes"].append(f"{cpu:.1f} s (reaped {stats['cpu_seconds']:.1f} s, sampled "
                                                f"{stats['sampled_cpu_seconds']:.1f} s)")
        table["load (1 min), start / end"].append(f"{stats['load'][0]:.1f} / {stats['load'][1]:.1f}")
        table["peak RSS, largest process"].append(f"{stats['peak_rss_mb'] / 1024:.2f} GB")
        table["peak RSS, all processes"].append(f"{stats['peak_tree_mb'] / 1024:.2f} GB")
        table["copies kept"].append(f"{copies:,}")
        table["copies kept, by kind"].append(str(copies_by_kind(kept, truth)))
        table["distinct problems lost"].append(f"{lost:,}" + (f" {by_kind}" if by_kind else ""))
    for label, cells in table.items():
        print(f"| {label} | " + " | ".join(cells) + " |")
    if len(outcome) == 2:
        (ours, our_cpu, copies, lost, rss), (theirs, their_cpu, their_copies, _, _) = outcome.values()
        print(f"\nspeed: {theirs / ours:.1f}x datatrove's rows/s (target >= 8), {their_cpu / our_cpu:.1f}x per CPU-second "
              f"(steadier on a shared machine); copies kept {copies:,} vs {their_copies:,} "
              f"(target: no more); problems lost {lost} (target 0); peak RSS {rss:.2f} GB (target <= 0.5)")
    if args.sweep:
        sweep(folder, rows, args.workers, env)


if __name__ == "__main__":  # datatrove's workers import this file again
    main()
