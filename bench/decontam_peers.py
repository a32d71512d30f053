"""Rufus `decontam` side by side with datatrove's n-gram decontamination on the same rows.

Clean training rows from $RUFUS_DATA_ROOT (GSM8K train, Code Alpaca 2k, HH-RLHF harmless, the
Alpaca seed tasks, AIME 2024 and 2025, MBPP sanitized) and planted leaks of GSM8K test, MATH-500,
HumanEval and IFEval prompts (the problem text each benchmark's eval reads), of four kinds, the
same number of each benchmark's items per kind:

    verbatim   the item as a user turn
    in_chat    the item inside a longer user turn (a clean row's request before it, an instruction after)
    edited     lightly edited: one number changed (a word, where it has none) and every tenth word
               swapped for a synonym where one is known
    reworded   one word in every five changed (synonym, number + 1, or a suffix): no 8-gram survives

The planted rows keep a clean row's assistant turn. All rows are shuffled and given to both
tools: Rufus as a shard folder (`rufus-data decontam --against gsm8k --against math500 --against
humaneval --against ifeval`), datatrove as JSONL files (the turns joined by newlines), its index
built from the same items (query: the problem; label: the first answer text, or none) with its
own hashing, at each n of `--datatrove-ngrams` with `find_query_ngrams` on.

    python bench/decontam_peers.py [--leaks 800] [--workers 2] [--semantic] [--skip-datatrove]

Printed: recall per leak kind, false positives (clean rows flagged: each printed with the item
it matched, to be read), and wall time of each run and their ratio. Targets (issue 44): recall per
kind at least datatrove's, overall >= 0.96 without `--semantic`, false positives at most a third
of the code before issue 44 on these rows, >= 4x datatrove's speed.

datatrove lives in a venv of its own (bench/dedup_peers.py's docstring; `DATATROVE_PYTHON`
names its interpreter). Its `NGramsDecontIndexer` reads the items through lighteval, which is
not installed there: the bench's indexer step hashes them with the indexer's own
`compute_hashes` and writes the index files its `NGramsDecontFilter` reads."""

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
BENCHMARKS = ("gsm8k", "math500", "humaneval", "ifeval")
KINDS = ("verbatim", "in_chat", "edited", "reworded")
DATATROVE_FILES = 8


# ---- the rows ---------------------------------------------------------------------------------

def clean_rows(root: Path) -> list[tuple[str, list[dict]]]:
    """(source, messages) of every clean training row."""
    def jsonl(path: str) -> list[dict]:
        with open(root / path) as fh:
            return [json.loads(line) for line in fh]

    def chat(user: str, assistant: str) -> list[dict]:
        return [{"role": "user", "content": user}, {"role": "assistant", "content": assistant}]

    rows = [("gsm8k_train", chat(r["question"], r["answer"])) for r in jsonl("gsm8k/train.jsonl")]
    rows += [("code_alpaca", chat(r["instruction"] + (f"\n{r['input']}" if r["input"] else ""), r["output"]))
             for r in jsonl("code_alpaca_2k/code_alpaca_2k.jsonl")]
    for r in jsonl("hh_rlhf_harmless_base/test.jsonl"):
        turns = [t for t in r["chosen"].split("\n\n") if t.strip()]
        rows.append(("hh_rlhf", [{"role": "user" if t.startswith("Human:") else "assistant", "content": t.split(":", 1)[-1].strip()}
                                 for t in turns]))
    rows += [("alpaca_seed", chat(r["instruction"] + (f"\n{r['instances'][0]['input']}" if r["instances"][0]["input"] else ""),
                                  r["instances"][0]["output"])) for r in jsonl("alpaca_seed_tasks/seed_tasks.jsonl")]
    rows += [("aime24", chat(r["problem"], r.get("solution") or str(r.get("answer", "")))) for r in jsonl("aime24/test.jsonl")]
    rows += [("aime25", chat(r["problem"], str(r["answer"]))) for r in jsonl("aime25/test.jsonl")]
    rows += [("mbpp", chat(r["prompt"] + "\n" + "\n".join(r["test_list"]), r["code"])) for r in jsonl("mbpp_sanitized/sanitized-mbpp.jsonl")]
    return rows


def edited(text: str, rng: random.Random) -> str:
    """One number changed (or, without one, a word), then every tenth word swapped for a synonym."""
    from decontam_planting import SYNONYMS, number_changed

    if re.search(r"\d", text):
        text = number_changed(text, rng)
    ws = text.split(" ")
    changed = not re.search(r"\d", text)
    for i in range(rng.randrange(10), len(ws), 10):
        core = ws[i].strip(".,?!").lower()
        if core in SYNONYMS:
            ws[i] = SYNONYMS[core] + ws[i][len(ws[i].rstrip(".,?!")):]
        elif changed:
            ws[i], changed = ws[i] + "s", False
    return " ".join(ws)


def planted(text: str, kind: str, host: list[dict], rng: random.Random) -> list[dict]:
    """The messages of a training row that leaks `text` the way `kind` says (module docstring)."""
    from decontam_planting import embedded, no_ngram_survives

    answer = next((m["content"] for m in host if m["role"] == "assistant"), "")
    if kind == "in_chat":
        request = next(m["content"] for m in host if m["role"] == "user")
        user = f"{request}\n\nAlso, one more thing. {embedded(text, rng)}"
    else:
        user = {"verbatim": lambda t: t, "edited": lambda t: edited(t, rng), "reworded": lambda t: no_ngram_survives(t, rng)}[kind](text)
    return [{"role": "user", "content": user}, {"role": "assistant", "content": answer}]


def build_rows(leaks: int, seed: int = 0) -> tuple[list[dict], list]:
    """Every row (id, source, label, messages, kind: `clean` or a leak kind, item) and the eval items."""
    sys.path.insert(0, str(REPO / "tests"))
    from rufus_data.base.paths import data_root
    from rufus_data.benchmarks import load_benchmarks

    rng = random.Random(seed)
    clean = clean_rows(data_root())
    items = load_benchmarks(list(BENCHMARKS)).items
    by_bench = {b: [it for it in items if it.benchmark == b] for b in BENCHMARKS}
    per = leaks // (len(KINDS) * len(BENCHMARKS))
    rows = [{"source": s, "messages": m, "kind": "clean", "item": ""} for s, m in clean]
    for bench, its in by_bench.items():
        for kind in KINDS:  # HumanEval has 164 items: an item may leak in more than one kind
            for it in rng.sample(its, per):
                host = clean[rng.randrange(len(clean))][1]
                rows.append({"source": f"leak_{kind}", "messages": planted(it.problems[0], kind, host, rng), "kind": kind,
                             "item": f"{bench}/{it.item_id}"})
    rng.shuffle(rows)
    for i, row in enumerate(rows):
        row["id"] = f"r{i}"
    return rows, items


def write_inputs(rows: list[dict], items: list, folder: Path) -> None:
    """The shard folder Rufus reads, the JSONL files and the items datatrove reads, and the truth."""
    import pyarrow as pa

    from rufus_data.folders.shards import write_shards

    write_shards(pa.Table.from_pylist([{"id": r["id"], "source": r["source"], "label": r["source"], "messages": r["messages"]}
                                       for r in rows]), folder / "shards", shard_rows=5_000)
    (folder / "jsonl").mkdir(parents=True)
    per_file = -(-len(rows) // DATATROVE_FILES)
    for f in range(DATATROVE_FILES):
        with open(folder / "jsonl" / f"part-{f:02d}.jsonl", "w") as fh:
            fh.writelines(json.dumps({"id": r["id"], "text": "\n".join(m["content"] for m in r["messages"])}) + "\n"
                          for r in rows[f * per_file : (f + 1) * per_file])
    with open(folder / "items.jsonl", "w") as fh:
        fh.writelines(json.dumps({"task": it.benchmark, "query": it.problems[0], "label": it.answers[0] if it.answers else ""}) + "\n"
                      for it in items)
    (folder / "truth.json").write_text(json.dumps({r["id"]: [r["kind"], r["item"], r["source"]] for r in rows}))


# ---- the runs ---------------------------------------------------------------------------------

def run_rufus(folder: Path, workers: int, env: dict, semantic: bool) -> tuple[dict, dict[str, list]]:
    """(measure's stats, row id -> [(benchmark/item, method)])."""
    import pyarrow.parquet as pq
    from scale_bench import measure

    out = folder / ("rufus_semantic" if semantic else "rufus_out")
    against = [a for b in BENCHMARKS for a in ("--against", b)]
    command = [sys.executable, "-c", "from rufus_data.cli import app; app()", "decontam", str(folder / "shards"), *against,
               "--out", str(out), "--overwrite", "--workers", str(workers), *(["--semantic"] if semantic else [])]
    stats = measure(command, env, folder)
    hits: dict[str, list] = {}
    for h in pq.read_table(out / "contaminated.parquet").to_pylist():
        hits.setdefault(h["row_id"], []).append((f"{h['benchmark']}/{h['eval_item_id']}", h["method"]))
    return stats, hits


def run_datatrove(folder: Path, workers: int, env: dict, n: int) -> tuple[dict, dict[str, list]]:
    import gzip

    from scale_bench import measure

    python = os.environ.get("DATATROVE_PYTHON", str(REPO / ".venv-datatrove" / "bin" / "python"))
    if not Path(python).exists():
        raise SystemExit(f"datatrove's interpreter {python} is missing: make the venv (module docstring) or set DATATROVE_PYTHON")
    stats = measure([python, __file__, "--datatrove-run", str(folder), "--workers", str(workers), "--datatrove-ngrams", str(n)],
                    env, folder)
    hits: dict[str, list] = {}
    for path in (folder / "datatrove" / "removed").glob("*"):
        with gzip.open(path, "rt") as fh:
            for line in fh:
                doc = json.loads(line)
                hits[doc["id"]] = [(doc.get("metadata", {}).get("contaminated_task", "?"), "ngram")]
    return stats, hits


def datatrove_pipeline(folder: Path, workers: int, n: int) -> None:
    """Index the items with datatrove's own hashing, then its filter over the rows (in its venv)."""
    import numpy as np
    from datatrove.executor import LocalPipelineExecutor
    from datatrove.pipeline.decont import NGramsDecontConfig, NGramsDecontFilter, NGramsDecontIndexer
    from datatrove.pipeline.readers import JsonlReader
    from datatrove.pipeline.writers.jsonl import JsonlWriter

    config = NGramsDecontConfig(n_grams=n, find_query_ngrams=True)
    base = folder / "datatrove"
    shutil.rmtree(base, ignore_errors=True)
    NGramsDecontIndexer._requires_dependencies = []  # its hashing only: the items come from the bench, not lighteval
    indexer = NGramsDecontIndexer(output_folder=str(base / "index"), config=config)
    hashes: dict[str, set] = {}
    with open(folder / "items.jsonl") as fh:
        for line in fh:
            item = json.loads(line)
            hashes.setdefault(item["task"], set()).update(indexer.compute_hashes(item["label"], item["query"]))
    (base / "index").mkdir(parents=True)
    for task, found in hashes.items():
        np.array(sorted(found), dtype=config.hash_config.np_descr).tofile(base / "index" / f"{task}.index.hashes")
    LocalPipelineExecutor(pipeline=[JsonlReader(str(folder / "jsonl")),
                                    NGramsDecontFilter(index_folder=str(base / "index"), config=config,
                                                       exclusion_writer=JsonlWriter(str(base / "removed"))),
                                    JsonlWriter(str(base / "kept"))],
                          tasks=DATATROVE_FILES, workers=workers, logging_dir=str(base / "logs")).run()


# ---- the tables -------------------------------------------------------------------------------

def score(hits: dict[str, list], truth: dict[str, list]) -> tuple[dict[str, float], list[str]]:
    """(recall per leak kind and overall, the clean rows flagged)."""
    found = {k: [0, 0] for k in KINDS}
    for rid, (kind, _, _) in truth.items():
        if kind in found:
            found[kind][0] += rid in hits
            found[kind][1] += 1
    recall = {k: v[0] / max(v[1], 1) for k, v in found.items()}
    recall["all"] = sum(v[0] for v in found.values()) / max(1, sum(v[1] for v in found.values()))
    return recall, sorted((rid for rid in hits if truth[rid][0] == "clean"), key=lambda r: int(r[1:]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--leaks", type=int, default=800)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--out", type=Path, default=REPO / "outputs" / "decontam_peers")
    parser.add_argument("--semantic", action="store_true", help="also a Rufus run with --semantic")
    parser.add_argument("--skip-datatrove", action="store_true")
    parser.add_argument("--datatrove-ngrams", default="8,10,12", help="datatrove's n, each its own run")
    parser.add_argument("--datatrove-run", type=Path, help=argparse.SUPPRESS)  # inside datatrove's venv
    args = parser.parse_args()
    if args.datatrove_run:
        datatrove_pipeline(args.datatrove_run, args.workers, int(args.datatrove_ngrams))
        return
    sys.path.insert(0, str(REPO))
    sys.path.insert(0, str(REPO / "bench"))
    folder = args.out / f"leaks-{args.leaks}"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    rows, items = build_rows(args.leaks)
    write_inputs(rows, items, folder)
    truth = json.loads((folder / "truth.json").read_text())
    print(f"{len(rows):,} rows: {sum(r['kind'] == 'clean' for r in rows):,} clean, "
          + ", ".join(f"{k} {sum(r['kind'] == k for r in rows)}" for k in KINDS))
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}", "OMP_NUM_THREADS": "1"}
    run_rufus(folder, args.workers, env, False)  # the eval index into $RUFUS_CACHE: every run after reads it
    runs = {"Rufus decontam": run_rufus(folder, args.workers, env, False)}
    if args.semantic:
        runs["Rufus decontam --semantic"] = run_rufus(folder, args.workers, env, True)
    if not args.skip_datatrove:
        for n in args.datatrove_ngrams.split(","):
            runs[f"datatrove 0.10.1, {n}-grams"] = run_datatrove(folder, args.workers, env, int(n))
    print(f"\n{len(rows):,} rows, {args.workers} workers\n")
    print("| | " + " | ".join(KINDS) + " | all | false positives | wall time |\n|---|" + "---:|" * (len(KINDS) + 3))
    flagged = {}
    for name, (stats, hits) in runs.items():
        recall, false = score(hits, truth)
        flagged[name] = (false, hits)
        print(f"| {name} | " + " | ".join(f"{recall[k]:.3f}" for k in (*KINDS, "all")) + f" | {len(false)} | {stats['seconds']:.1f} s |")
    ours = runs["Rufus decontam"][0]["seconds"]
    for name, (stats, _) in runs.items():
        if name.startswith("datatrove"):
            print(f"{name}: {stats['seconds'] / ours:.1f}x Rufus's wall time")
    by_id = {r["id"]: r for r in rows}
    for name, (false, hits) in flagged.items():
        print(f"\n{name}: clean rows flagged")
        for rid in false:
            text = " ".join(m["content"] for m in by_id[rid]["messages"])[:160].replace("\n", " ")
            print(f"  {rid} [{by_id[rid]['source']}] {hits[rid][:3]}: {text}")


if __name__ == "__main__":  # datatrove's workers import this file again
    main()
