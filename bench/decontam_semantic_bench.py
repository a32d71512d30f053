"""The semantic decontam stage (issue 15): recall on paraphrases, false positives, and cost.

1. Accuracy, against gsm8k (GSM8K test), exact + MinHash alone and with `--semantic`:
   - GSM-Plus testmini questions (each a perturbation of a GSM8K test question), flagged per
     perturbation type; targets: "problem understanding" >= 0.60, all rows >= 0.93;
   - Code Alpaca 2k rows flagged (target <= 0.5%);
   - GSM8K **train** rows flagged (target <= 2%), with the top semantic hits for a reader to judge
     (train and test share some real near-duplicates).
2. Speed on the rows of bench/decontam_bench.py (GSM8K train, Code Alpaca, HH-RLHF harmless,
   x DECONTAM_BENCH_REPEAT) against gsm8k: the semantic stage's own rows/s (embedding, search and
   evidence, one process), and the whole decontam with `--semantic` against exact + MinHash alone
   (target: at most 2x): a first run each (it builds the eval index and loads the model, as a
   command does), then SEMANTIC_BENCH_RUNS (5) runs of each, interleaved; the ratio is taken run
   by run and its median printed with its range. DECONTAM_BENCH_REPEAT=1 gives distinct rows only: the repeats of
   the default x3 find their words already in each worker's word cache.
3. `dedup --semantic`: GSM-Plus "problem understanding" rewrites after their GSM8K test
   questions, and `decontam_planting.paraphrased` rewordings after theirs, among GSM8K train,
   Code Alpaca and HH-RLHF rows: the rewrites dropped, the distinct rows dropped (with examples
   for a reader to judge), and the time against MinHash dedup alone.

Needs $RUFUS_DATA_ROOT (shared/data); runs offline. `python bench/decontam_semantic_bench.py`."""

from __future__ import annotations

import os
import random
import resource
import statistics
import sys
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path

import pyarrow as pa

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parent.parent / "tests"))
from decontam_bench import load_rows  # the speed rows of the exact + MinHash bench
from decontam_planting import paraphrased, shared_ngrams  # the CI test's rewordings

from rufus_data.base.jsonl import read_jsonl
from rufus_data.base.paths import data_root
from rufus_data.benchmarks import load_benchmarks
from rufus_data.decontam import DecontamConfig, decontam
from rufus_data.decontam.index import cached_eval_index
from rufus_data.decontam.semantic_stage import match_fields
from rufus_data.decontam.texts import FieldBatch
from rufus_data.dedup import DedupConfig, dedup
from rufus_data.folders.shards import write_shards
from rufus_data.similarity.ngram_hash import TokenHasher

AGAINST = ["gsm8k"]


def cpu_seconds() -> float:
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def accuracy_rows(root: Path) -> list[dict]:
    rows = []
    for r in read_jsonl(root / "gsm_plus" / "testmini.jsonl"):
        rows.append({"source": f"gsm_plus/{r['perturbation_type']}", "messages": [{"role": "user", "content": r["question"]}]})
    for r in read_jsonl(root / "code_alpaca_2k" / "code_alpaca_2k.jsonl"):
        rows.append({"source": "code_alpaca", "messages": [
            {"role": "user", "content": r["instruction"] + (f"\n{r['input']}" if r["input"] else "")},
            {"role": "assistant", "content": r["output"]}]})
    for r in read_jsonl(root / "gsm8k" / "train.jsonl"):
        rows.append({"source": "gsm8k_train", "messages": [{"role": "user", "content": r["question"]},
                                                           {"role": "assistant", "content": r["answer"]}]})
    return [{"id": f"r{i}", "label": r["source"], **r} for i, r in enumerate(rows)]


def flagged_by_source(result, sources: list[str]) -> tuple[Counter, dict[str, Counter]]:
    rows = {h["row"] for h in result.hits.to_pylist()}
    by_source = Counter(sources[r] for r in rows)
    by_method: dict[str, Counter] = defaultdict(Counter)
    for h in result.hits.to_pylist():
        by_method[sources[h["row"]]][h["method"]] += 1
    return by_source, by_method


def accuracy(root: Path, work: Path) -> None:
    rows = accuracy_rows(root)
    sources = [r["source"] for r in rows]
    totals = Counter(sources)
    src = work / "accuracy"
    write_shards(pa.Table.from_pylist(rows), src)
    base = decontam(src, None, DecontamConfig(against=AGAINST), report_only=True)
    semantic = decontam(src, None, DecontamConfig(against=AGAINST, semantic=True), report_only=True)
    (b, _), (s, methods) = flagged_by_source(base, sources), flagged_by_source(semantic, sources)
    print("\n## Accuracy against gsm8k (share of rows flagged)\n")
    print("| rows | n | exact + MinHash | + semantic | semantic-only hits |")
    print("| --- | ---: | ---: | ---: | ---: |")
    plus = sorted(k for k in totals if k.startswith("gsm_plus/"))
    for key in [*plus, "code_alpaca", "gsm8k_train"]:
        print(f"| {key} | {totals[key]:,} | {b[key] / totals[key]:.3f} | {s[key] / totals[key]:.4f} | {methods[key]['semantic']} |")
    n_plus = sum(totals[k] for k in plus)
    print(f"| gsm_plus, all rows | {n_plus:,} | {sum(b[k] for k in plus) / n_plus:.3f} | {sum(s[k] for k in plus) / n_plus:.3f} | |")
    items = {(it.benchmark, it.item_id): it.problems[0] for it in load_benchmarks(AGAINST).items}
    texts = {r["id"]: r["messages"][0]["content"] for r in rows}
    flagged_by_text = {h["row"] for h in semantic.hits.to_pylist() if h["method"] != "semantic"}
    top = sorted((h for h in semantic.hits.to_pylist()
                  if h["source"] == "gsm8k_train" and h["method"] == "semantic" and h["row"] not in flagged_by_text),
                 key=lambda h: -h["similarity"])
    print(f"\n## GSM8K train rows flagged only by the semantic stage: {len({h['row'] for h in top})}; the top 10\n")
    for h in top[:10]:
        e = h["evidence"]
        print(f"- cos {h['similarity']:.3f}, quantities {e['quantities_kept']}/{e['quantities_total']} "
              f"({e['quantity_share']:.2f}), words "
              f"{e['word_share']:.2f} ({', '.join(e['shared_words'][:4])})\n  train {h['row_id']}: {texts[h['row_id']][:160]!r}\n"
              f"  test {h['eval_item_id']}: {items[(h['benchmark'], h['eval_item_id'])][:160]!r}")


RUNS = int(os.environ.get("SEMANTIC_BENCH_RUNS", "5"))


def timed_run(src: Path, config: DecontamConfig) -> tuple[float, float, int]:
    """(wall seconds, CPU seconds of this process and its workers, rows flagged) of one decontam."""
    cpu, start = cpu_seconds(), time.perf_counter()
    result = decontam(src, None, config.model_copy(update={"against": AGAINST}), report_only=True)
    return time.perf_counter() - start, cpu_seconds() - cpu, len(result.flagged_rows)


def speed(root: Path, work: Path) -> None:
    rows = load_rows(root)
    src = work / "speed"
    write_shards(pa.Table.from_pylist(rows), src, shard_rows=4000)  # several tasks for the 2 local processes
    print(f"\n## Speed: {len(rows):,} rows (decontam_bench rows x {os.environ.get('DECONTAM_BENCH_REPEAT', '3')}) against gsm8k\n")
    # two local processes, one per core, at every size (auto would stay in-process below 20k rows)
    configs = {"exact + MinHash": DecontamConfig(workers=2), "exact + MinHash + semantic": DecontamConfig(semantic=True, workers=2)}
    first = {name: timed_run(src, config) for name, config in configs.items()}  # builds the eval index, loads the model
    runs: dict[str, list[tuple[float, float, int]]] = {name: [] for name in configs}
    for _ in range(RUNS):  # interleaved, so a burst of load elsewhere on the machine hits both
        for name, config in configs.items():
            runs[name].append(timed_run(src, config))
    print(f"| decontam | first run (builds the index) s | median of {RUNS} later runs: wall s | rows/s | CPU s | flagged |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for name in configs:
        wall, cpu = statistics.median(r[0] for r in runs[name]), statistics.median(r[1] for r in runs[name])
        print(f"| {name} | {first[name][0]:.2f} | {wall:.2f} | {len(rows) / wall:,.0f} | {cpu:.2f} | {runs[name][0][2]:,} |")
    base, semantic = runs["exact + MinHash"], runs["exact + MinHash + semantic"]
    wall_ratios = sorted(s[0] / b[0] for b, s in zip(base, semantic))
    cpu_ratios = sorted(s[1] / b[1] for b, s in zip(base, semantic))
    print(f"\n- time with --semantic / without, run by run (target <= 2x): wall {statistics.median(wall_ratios):.2f}x median "
          f"({wall_ratios[0]:.2f}-{wall_ratios[-1]:.2f}), CPU {statistics.median(cpu_ratios):.2f}x median "
          f"({cpu_ratios[0]:.2f}-{cpu_ratios[-1]:.2f}); first runs: "
          f"{first['exact + MinHash + semantic'][0] / first['exact + MinHash'][0]:.2f}x wall")
    print()
    # then the stage alone, one process (after the timed runs: their first runs build the eval
    # indexes and load the model, as a command does): every field embedded, searched and checked (the fields are
    # normalised and hashed first, once, as decontam does for all its stages)
    config = DecontamConfig(semantic=True)
    index = cached_eval_index(load_benchmarks(AGAINST), config)
    table = pa.Table.from_pylist(rows)
    batches = [FieldBatch.of(table.slice(lo, config.batch_rows), TokenHasher()) for lo in range(0, table.num_rows, config.batch_rows)]
    for label in ("cold word caches", "warm"):
        cpu, start = cpu_seconds(), time.perf_counter()
        for batch in batches:
            match_fields(batch.tokens, batch.ids, batch.offsets, index.semantic, config)
        wall = time.perf_counter() - start
        print(f"- semantic stage alone ({label}, one process): {len(rows) / wall:,.0f} rows/s wall, "
              f"{len(rows) / (cpu_seconds() - cpu):,.0f} rows per CPU-second")


def dedup_rows(root: Path) -> tuple[list[dict], dict[str, str]]:
    """Originals, then distinct rows, then the rewrites; and which original each rewrite restates."""
    def row(rid: str, source: str, *turns: str) -> dict:
        roles = ("user", "assistant")
        return {"id": rid, "source": source, "label": source,
                "messages": [{"role": roles[i % 2], "content": t} for i, t in enumerate(turns)]}

    plus = [r for r in read_jsonl(root / "gsm_plus" / "testmini.jsonl") if r["perturbation_type"] == "problem understanding"]
    originals = [row(f"seed{k}", "original", r["seed_question"]) for k, r in enumerate(plus)]
    copies = [row(f"plus{k}", "gsm_plus", r["question"]) for k, r in enumerate(plus)]
    truth = {f"plus{k}": f"seed{k}" for k in range(len(plus))}
    seeds, rng = {r["seed_question"] for r in plus}, random.Random(5)
    for k, r in enumerate(read_jsonl(root / "gsm8k" / "test.jsonl")):
        text = paraphrased(r["question"], rng)
        if r["question"] not in seeds and len(r["question"].split()) >= 25 and not shared_ngrams(r["question"], text):
            originals.append(row(f"test{k}", "original", r["question"]))
            copies.append(row(f"planted{k}", "planted", text))
            truth[f"planted{k}"] = f"test{k}"
    distinct = [row(f"train{k}", "gsm8k_train", r["question"], r["answer"])
                for k, r in enumerate(read_jsonl(root / "gsm8k" / "train.jsonl"))]
    distinct += [row(f"alpaca{k}", "code_alpaca", r["instruction"] + (f"\n{r['input']}" if r["input"] else ""), r["output"])
                 for k, r in enumerate(read_jsonl(root / "code_alpaca_2k" / "code_alpaca_2k.jsonl"))]
    distinct += [row(f"hh{k}", "hh_rlhf", r["chosen"]) for k, r in enumerate(read_jsonl(root / "hh_rlhf_harmless_base" / "test.jsonl"))]
    return originals + distinct + copies, truth


def dedup_bench(root: Path, work: Path) -> None:
    rows, truth = dedup_rows(root)
    src = work / "dedup"
    write_shards(pa.Table.from_pylist(rows), src)
    sources = {r["id"]: r["source"] for r in rows}
    totals = Counter(sources.values())
    runs = {}
    for name, config in (("MinHash", DedupConfig()), ("MinHash + semantic", DedupConfig(semantic=True))):
        cpu, start = cpu_seconds(), time.perf_counter()
        result = dedup(src, None, config, report_only=True)
        runs[name] = (result, time.perf_counter() - start, cpu_seconds() - cpu)
    print(f"\n## dedup --semantic: {len(rows):,} rows\n")
    print("| rows | n | dropped by MinHash | dropped with --semantic |")
    print("| --- | ---: | ---: | ---: |")
    dropped = {name: {p["duplicate_id"]: p for p in result.clusters.to_pylist()} for name, (result, _, _) in runs.items()}
    for source in ("gsm_plus", "planted", "original", "gsm8k_train", "code_alpaca", "hh_rlhf"):
        ids = [i for i, s in sources.items() if s == source]
        shares = [sum(i in dropped[name] and (i not in truth or dropped[name][i]["kept_id"] == truth[i]) for i in ids) / len(ids)
                  for name in runs]
        print(f"| {source} | {totals[source]:,} | {shares[0]:.4f} | {shares[1]:.4f} |")
    for name, (result, wall, cpu) in runs.items():
        print(f"- {name}: {wall:.2f} s wall, {cpu:.2f} CPU s, {len(result.dropped):,} rows dropped")
    (_, base_wall, base_cpu), (result, wall, cpu) = runs.values()
    print(f"- time with --semantic / without: {wall / base_wall:.2f}x wall, {cpu / base_cpu:.2f}x CPU")
    text = {r["id"]: " / ".join(m["content"] for m in r["messages"]) for r in rows}
    others = [c for c in dropped["MinHash + semantic"].values()
              if c["method"] == "semantic" and sources[c["duplicate_id"]] not in ("gsm_plus", "planted")]
    print(f"\nDistinct rows the semantic stage dropped: {len(others)}; the first 8\n")
    for c in others[:8]:
        print(f"- cos {c['similarity']:.3f}, {c['shared_quantities']} quantities, Jaccard {c['word_share']:.2f}\n"
              f"  kept {c['kept_id']}: {text[c['kept_id']][:150]!r}\n  dropped {c['duplicate_id']}: {text[c['duplicate_id']][:150]!r}")


def main() -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    root = data_root()
    with tempfile.TemporaryDirectory() as tmp:
        if os.environ.get("SEMANTIC_BENCH_PART", "all") in ("all", "accuracy"):
            accuracy(root, Path(tmp))
        if os.environ.get("SEMANTIC_BENCH_PART", "all") in ("all", "speed"):
            speed(root, Path(tmp))
        if os.environ.get("SEMANTIC_BENCH_PART", "all") in ("all", "dedup"):
            dedup_bench(root, Path(tmp))


if __name__ == "__main__":
    main()
