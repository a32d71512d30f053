"""What decontam tells a person: the result of a run, the summary table printed at the end, and
report.md (rows flagged per source x benchmark and per split, what was skipped, the first hits)."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

import pyarrow as pa
from rich.table import Table

from rufus_data.base.catalog_files import docs_page
from rufus_data.decontam.config import DecontamConfig
from rufus_data.folders.output_step import StepResult

SEMANTIC = "semantic"
STAGES = ("exact", "minhash", "numbers", SEMANTIC)


@dataclass(kw_only=True)
class DecontamResult(StepResult):
    """A decontam run: the StepResult (counts: rows in, out, dropped, hits) and what it found."""

    hits: pa.Table  # rules.HIT_SCHEMA plus `split`
    rows_in: int
    rows_out: int
    flagged_rows: set[int]
    missing: dict[str, str]
    benchmarks: dict[str, dict]
    boilerplate_train_grams: list[str]
    index_stats: dict
    seconds: float = 0.0
    not_decontaminable: dict[str, str] = field(default_factory=dict)  # suite/task (or benchmark) -> why
    splits: dict[str, dict[str, int]] = field(default_factory=dict)  # split -> {"rows", "flagged"}
    judge: dict[str, int] = field(default_factory=dict)  # the LLM judge's verdicts on semantic pairs, counted


def source_benchmark_counts(result: DecontamResult) -> dict[tuple[str, str], set[int]]:
    """(source, benchmark) -> the flagged rows."""
    counts: dict[tuple[str, str], set[int]] = defaultdict(set)
    for src, bench, row in zip(*(result.hits.column(c).to_pylist() for c in ("source", "benchmark", "row"))):
        counts[(src, bench)].add(row)
    return counts


def rows_removed_by_benchmark(result: DecontamResult) -> dict[str, int]:
    """Benchmark -> the rows it flagged, for every benchmark checked (0: checked and clean); a row
    that hits two benchmarks counts for both. The manifest records it: a run's lineage reads it."""
    rows: dict[str, set[int]] = {name: set() for name in result.benchmarks}
    for bench, row in zip(*(result.hits.column(c).to_pylist() for c in ("benchmark", "row"))):
        rows.setdefault(bench, set()).add(row)
    return {name: len(found) for name, found in sorted(rows.items())}


def summary_table(result: DecontamResult) -> Table:
    counts = source_benchmark_counts(result)
    benches = sorted({b for _, b in counts}) or ["-"]
    table = Table(title=f"decontam: {len(result.flagged_rows):,} of {result.rows_in:,} rows flagged "
                        f"({result.rows_in / max(result.seconds, 1e-9):,.0f} rows/s)")
    table.add_column("source")
    for b in benches:
        table.add_column(b, justify="right")
    for src in sorted({s for s, _ in counts}):
        table.add_row(src or "-", *(str(len(counts.get((src, b), ()))) for b in benches))
    return table


def decontam_report(result: DecontamResult, against: list[str], config: DecontamConfig) -> str:
    """The text of report.md."""
    counts = source_benchmark_counts(result)
    benches = sorted({b for _, b in counts})
    methods = defaultdict(int)
    for m in result.hits.column("method").to_pylist():
        methods[m] += 1
    lines = [
        "# decontam report", "",
        (f"Checked {result.rows_in:,} rows against {', '.join(against)} "
         f"({result.index_stats['eval_items']:,} eval items from {', '.join(result.benchmarks)})."),
        (f"**{len(result.flagged_rows):,} rows flagged and dropped** ({len(result.flagged_rows) / max(1, result.rows_in):.2%}); "
         f"{result.rows_out:,} rows kept. Hits: {result.hits.num_rows:,} "
         f"(exact {methods['exact']:,}, minhash {methods['minhash']:,}, numbers {methods['numbers']:,}"
         f"{f', semantic {methods[SEMANTIC]:,}' if config.semantic else ''})."), "",
        (f"Settings: n={config.ngram}-word grams, MinHash over {config.shingle}-word shingles with {config.num_perm} "
         f"permutations, containment >= {config.containment}, windows of {config.window} shingles."), "",
        *_semantic_settings(result, config),
        "## Rows flagged, by source x benchmark", "",
    ]
    if benches:
        lines += ["| source | " + " | ".join(benches) + " |", "| --- |" + " ---: |" * len(benches)]
        for src in sorted({s for s, _ in counts}):
            lines.append(f"| {src or '-'} | " + " | ".join(str(len(counts.get((src, b), ()))) for b in benches) + " |")
    else:
        lines.append("No hits.")
    if len(result.splits) > 1:
        lines += ["", "## Rows flagged, by split", "", "| split | rows | flagged |", "| --- | ---: | ---: |"]
        lines += [f"| {split} | {n['rows']:,} | {n['flagged']:,} |" for split, n in result.splits.items()]
    if result.missing:
        lines += ["", "## Benchmarks skipped (--skip-missing)", ""]
        lines += [f"- `{name}`: {why}" for name, why in result.missing.items()]
    if result.not_decontaminable:
        lines += ["", "## Suite tasks not checked (no problem text in the registry)", ""]
        lines += [f"- `{task}`: {why}" for task, why in result.not_decontaminable.items()]
    if result.boilerplate_train_grams:
        lines += ["", "## n-grams ignored as training-side boilerplate", ""]
        lines += [f"- `{g}`" for g in result.boilerplate_train_grams[:30]]
    lines += _examples_by_stage(result)
    lines += ["", "## First hits", "", "| row id | benchmark | item | method | containment | field | matched |",
              "| --- | --- | --- | --- | ---: | --- | --- |"]
    for hit in result.hits.slice(0, 30).to_pylist():
        grams = "; ".join(hit["matched_ngrams"][:2]).replace("|", "\\|")
        lines.append(f"| {hit['row_id']} | {hit['benchmark']} | {hit['eval_item_id']} | {hit['method']} | "
                     f"{hit['containment']:.2f} | {', '.join(hit['fields'][:2])} | {grams[:120]} |")
    lines += ["", ("contaminated.parquet holds every hit (one row per training row x eval item); "
                   f"{docs_page('decontam.md')} explains the columns and the thresholds."), ""]
    return "\n".join(lines)


def _semantic_settings(result: DecontamResult, config: DecontamConfig) -> list[str]:
    if not config.semantic:
        return []
    judge = ""
    if config.judge_url:
        verdicts = ", ".join(f"{k} {v:,}" for k, v in result.judge.items()) or "no pair needed it"
        judge = f" LLM judge {config.judge_model or '(server default model)'} at {config.judge_url}: {verdicts}."
    return [(f"Semantic stage: {result.index_stats.get('semantic_model')} embeddings "
             f"({result.index_stats.get('semantic_search')}), top {config.semantic_top_k} items per field or "
             f"{config.semantic_window}-word window at cosine >= {config.semantic_min_cosine}; a hit keeps "
             f">= {config.semantic_quantity_share:.0%} of the item's quantities and >= {config.semantic_word_share:.0%} "
             f"of its rarity-weighted content words (items with fewer than {config.semantic_min_quantities} quantities: "
             f"cosine >= {config.semantic_few_quantities_cosine}, words >= {config.semantic_few_quantities_word_share:.0%})."
             f"{judge}"), ""]


def evidence_text(hit: dict) -> str:
    """A hit's semantic evidence in a few words (report tables)."""
    e = hit.get("evidence")
    if not e:
        return ""
    parts = [f"cos {hit['similarity']:.2f}", f"quantities {e['quantities_kept']}/{e['quantities_total']} ({e['quantity_share']:.2f})",
             f"words {e['word_share']:.2f}"]
    if e["entities_total"]:
        parts.append(f"entities {e['entities_kept']}/{e['entities_total']}")
    if hit.get("judge"):
        parts.append(f"judge {hit['judge']}")
    return ", ".join(parts) + (f" ({', '.join(e['shared_words'][:4])})" if e["shared_words"] else "")


def _examples_by_stage(result: DecontamResult, per_stage: int = 5) -> list[str]:
    """Rows flagged by each stage (a row counts for the first stage that flagged it) and a few examples."""
    first: dict[int, str] = {}
    examples: dict[str, list[dict]] = defaultdict(list)
    for hit in result.hits.to_pylist():
        stage = hit["method"]
        if hit["row"] not in first or STAGES.index(stage) < STAGES.index(first[hit["row"]]):
            first[hit["row"]] = stage
        if len(examples[stage]) < per_stage:
            examples[stage].append(hit)
    if not first:
        return []
    rows = defaultdict(int)
    for stage in first.values():
        rows[stage] += 1
    lines = ["", "## Rows flagged, by stage", "", "| stage | rows | hits |", "| --- | ---: | ---: |"]
    hits = defaultdict(int)
    for m in result.hits.column("method").to_pylist():
        hits[m] += 1
    lines += [f"| {stage} | {rows[stage]:,} | {hits[stage]:,} |" for stage in STAGES if hits[stage]]
    for stage in STAGES:
        if not examples[stage]:
            continue
        lines += ["", f"Examples ({stage}):", "", "| row id | benchmark | item | field | evidence |", "| --- | --- | --- | --- | --- |"]
        for hit in examples[stage]:
            evidence = (evidence_text(hit) if stage == SEMANTIC
                        else f"containment {hit['containment']:.2f}; " + "; ".join(hit["matched_ngrams"][:2]))
            lines.append(f"| {hit['row_id']} | {hit['benchmark']} | {hit['eval_item_id']} | {', '.join(hit['fields'][:2])} "
                         f"| {evidence.replace('|', chr(92) + '|')[:160]} |")
    return lines
