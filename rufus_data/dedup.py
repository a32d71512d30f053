"""`rufus-data dedup`: the MinHash machinery of decontam turned inward. Near-duplicate rows
inside one mix skew token shares as surely as a bad catalog, so each cluster of near
duplicates keeps only its first row (input order: shard by shard, row by row) and the report
lists the clusters.

Every split of the folder is read, train first: a holdout row that duplicates a train row is
dropped from the holdout (it would measure memorisation, not generalisation).

A mix's own repeats (an upsampled source's copies of one row, which share an `origin_id`) are no
duplicates: every copy follows its first one, kept or dropped, and is never compared. Dedup
still moves token shares when the near duplicates sit unevenly in the sources, so the report
and manifest give each source's share of the train tokens before and after and warn when one
moves more than a percentage point: dedup belongs before mixing (dedup each source, then mix;
docs/data.md), and on a mix it is a check that says how far the shares moved.

Each row's text (all its text fields, normalised as in decontam) becomes a set of word
shingles; signatures come from datasketch's `MinHash.bulk` and are stored as `LeanMinHash`;
a datasketch `MinHashLSH` finds candidates among the rows kept so far, and a candidate counts
only if the exact Jaccard similarity of the two shingle sets reaches the threshold.

With `semantic: true` (`--semantic`) a second stage looks among the rows MinHash kept for rows
that say the same thing in other words (rufus_data/dedup_semantic.py); clusters.parquet and the
report say which stage dropped each row."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from datasketch import MinHashLSH
from pydantic import Field
from rich.table import Table

from rufus_data.console import console, print_result, progress
from rufus_data.dedup_semantic import SemanticPair, embed_rows, semantic_duplicates
from rufus_data.embedding import DEFAULT_MODEL
from rufus_data.minhash_lsh import lean, signatures
from rufus_data.ngram_hash import TokenHasher, batch_gram_hashes, fold32, gram_hashes, tokenize_batch
from rufus_data.output_step import OutputStep
from rufus_data.report import markdown_table
from rufus_data.shards import ORIGIN_COLUMN, read_manifest, shard_row_counts, split_files
from rufus_data.text_fields import text_fields
from rufus_data.yaml_config import StrictModel

CLUSTER_SCHEMA = pa.schema([
    ("kept_id", pa.string()), ("kept_row", pa.int64()), ("duplicate_id", pa.string()), ("duplicate_row", pa.int64()),
    ("jaccard", pa.float64()), ("kept_split", pa.string()), ("duplicate_split", pa.string()),
    ("method", pa.string()),  # the stage that dropped the row: minhash or semantic
    ("similarity", pa.float64()), ("word_share", pa.float64()), ("shared_quantities", pa.int64()),  # semantic only
])


class DedupConfig(StrictModel):
    """Every knob of dedup (settable with `rufus-data dedup --config FILE.yaml`)."""

    threshold: float = Field(0.8, gt=0, le=1, description="exact Jaccard of shingle sets to call two rows duplicates")
    shingle: int = Field(3, ge=1, description="word shingle length")
    num_perm: int = Field(128, ge=16)
    batch_rows: int = Field(5000, ge=1)
    seed: int = 1
    # stage 2, semantic (off by default; rufus_data/dedup_semantic.py, measured in docs/decontam.md)
    semantic: bool = Field(False, description="also drop rows that restate an earlier row in other words")
    semantic_model: str = Field(DEFAULT_MODEL, description="`wordllama` (ships in its wheel) or a sentence-transformers model")
    semantic_top_k: int = Field(5, ge=1, description="nearest earlier rows checked per row")
    semantic_min_cosine: float = Field(0.75, ge=-1, le=1, description="pairs below this cosine are not considered")
    semantic_word_share: float = Field(0.2, ge=0, le=1, description="Jaccard of content stems, rows decided by their quantities")
    semantic_few_quantities_cosine: float = Field(0.95, ge=-1, le=1, description="cosine needed by rows with too few quantities")
    semantic_few_quantities_word_share: float = Field(0.6, ge=0, le=1, description="Jaccard needed by rows with too few quantities")
    semantic_clustered_from: int = Field(20_000, ge=1, description="rows from which the search is clustered (approximate)")


SHARE_SHIFT_PP = 1.0  # a source whose token share moves more than this (percentage points) is warned about


@dataclass
class DedupResult:
    rows_in: int
    rows_out: int
    clusters: pa.Table  # kept row id, duplicate row id, jaccard
    dropped: set[int]
    seconds: float
    out: Path | None = None
    shares: list[dict] = field(default_factory=list)  # per source: train token share before and after
    warnings: list[str] = field(default_factory=list)
    semantic_pairs: list[SemanticPair] = field(default_factory=list)  # what the semantic stage found (with --semantic)


def _row_shingles(table: pa.Table, shingle: int, hasher: TokenHasher) -> list[np.ndarray]:
    """One sorted shingle set per row: all text fields of the row (fields are shingled apart)."""
    texts, row_of, _ = text_fields(table)
    sets: list[list[np.ndarray]] = [[] for _ in range(table.num_rows)]
    if texts:
        _, ids, offsets = tokenize_batch(texts, hasher)
        grams, owner = batch_gram_hashes(ids, offsets, shingle)
        shingles = fold32(grams)
        lengths = np.diff(offsets)
        for t in np.flatnonzero((lengths > 0) & (lengths < shingle)).tolist():
            piece = ids[offsets[t] : offsets[t + 1]]  # shorter than a shingle: one shingle of all its words
            sets[int(row_of[t])].append(fold32(gram_hashes(piece, len(piece))))
        order = np.argsort(owner, kind="stable")
        bounds = np.searchsorted(owner[order], np.arange(len(texts) + 1))
        for t in range(len(texts)):
            sets[int(row_of[t])].append(shingles[order[bounds[t]:bounds[t + 1]]])
    return [np.unique(np.concatenate(s)) if s else np.empty(0, np.uint32) for s in sets]


def _row_texts(table: pa.Table) -> list[str]:
    """One text per row: its text fields, one per line (what the semantic stage embeds)."""
    texts, row_of, _ = text_fields(table)
    parts: list[list[str]] = [[] for _ in range(table.num_rows)]
    for text, row in zip(texts, np.asarray(row_of).tolist()):
        parts[row].append(text)
    return ["\n".join(p) for p in parts]


def _texts_at(files: list[Path], rows: list[int]) -> list[str]:
    """The texts of some global rows, read again from the shards (the semantic stage reads only
    the rows of its candidate pairs, so no text is held for the whole run)."""
    wanted, found, first = set(rows), {}, 0
    for path in files:
        count = pq.ParquetFile(path).metadata.num_rows
        local = [r - first for r in sorted(wanted) if first <= r < first + count]
        if local:
            found.update(zip((first + i for i in local), _row_texts(pq.read_table(path).take(local))))
        first += count
    return [found[r] for r in rows]


def deduplicate(shards: str | Path, out: str | Path | None = None, *, dry_run: bool = False, overwrite: bool = False,
                config: DedupConfig | None = None, show_progress: bool = True) -> DedupResult:
    """Drop near-duplicate rows (keep the first of each cluster); write clean shards + clusters.parquet."""
    config = config or DedupConfig()
    by_split = split_files(shards)
    files = [path for paths in by_split.values() for path in paths]
    step = OutputStep("rufus-data dedup", out, overwrite=overwrite, dry_run=dry_run)
    rows_in = sum(shard_row_counts(files))
    hasher = TokenHasher()
    # the LSH looks for candidates below the threshold, so pairs just above it are not missed;
    # the exact Jaccard re-check decides
    lsh = MinHashLSH(threshold=max(0.1, config.threshold - 0.15), num_perm=config.num_perm, weights=(0.3, 0.7))
    kept_sets: dict[int, np.ndarray] = {}
    kept_ids: dict[int, str] = {}
    kept_split: dict[int, str] = {}
    split_of = {path: split for split, paths in by_split.items() for path in paths}
    pairs: list[dict] = []
    dropped: set[int] = set()
    first_copy: dict[str, dict | None] = {}  # origin id -> the pair that dropped its first copy (None: kept)
    origin_row: dict[str, int] = {}  # origin id -> its first copy's global row
    later_copies: dict[int, list[tuple[int, str, str]]] = {}  # a kept first copy's row -> its repeats (row, id, split)
    semantic_rows: list[int] = []  # the rows MinHash kept, which the semantic stage compares
    vectors: list[np.ndarray] = []
    token_column = _token_column(shards)
    train_tokens: list[tuple[str, int]] = []  # (source, tokens) of every train row, in row order
    row = 0
    with progress("rows") as bar:
        job = bar.add_task("dedup", total=rows_in) if show_progress else None
        for path in files:
            table = pq.read_table(path)
            ids = table.column("id").to_pylist() if "id" in table.column_names else [str(row + i) for i in range(table.num_rows)]
            origins = table.column(ORIGIN_COLUMN).to_pylist() if ORIGIN_COLUMN in table.column_names else None
            if split_of[path] == "train":
                train_tokens += _row_tokens(table, token_column)
            for start in range(0, table.num_rows, config.batch_rows):
                part = table.slice(start, config.batch_rows)
                sets = _row_shingles(part, config.shingle, hasher)
                sigs = lean(signatures(sets, config.num_perm, config.seed))
                batch_kept: list[int] = []
                for j, (shingles, sig) in enumerate(zip(sets, sigs)):
                    global_row = row + start + j
                    origin = None if origins is None or origins[start + j] is None else str(origins[start + j])
                    if origin is not None and origin in first_copy:  # a mix's repeat: as its first copy
                        if first_copy[origin] is not None:
                            dropped.add(global_row)
                            pairs.append({**first_copy[origin], "duplicate_id": str(ids[start + j]),
                                          "duplicate_row": global_row, "duplicate_split": split_of[path]})
                        elif origin in origin_row:
                            later_copies.setdefault(origin_row[origin], []).append(
                                (global_row, str(ids[start + j]), split_of[path]))
                        continue
                    best, best_score = None, 0.0
                    if len(shingles):
                        for other in lsh.query(sig):
                            ref = kept_sets[other]
                            inter = len(np.intersect1d(shingles, ref, assume_unique=True))
                            score = inter / (len(shingles) + len(ref) - inter)
                            if score >= config.threshold and (score > best_score or (score == best_score and other < best)):
                                best, best_score = other, score
                    if origin is not None:
                        first_copy[origin], origin_row[origin] = None, global_row
                    if best is not None:
                        dropped.add(global_row)
                        pairs.append({"kept_id": kept_ids[best], "kept_row": best, "duplicate_id": str(ids[start + j]),
                                      "duplicate_row": global_row, "jaccard": round(best_score, 4),
                                      "kept_split": kept_split[best], "duplicate_split": split_of[path], "method": "minhash"})
                        if origin is not None:
                            first_copy[origin] = pairs[-1]
                    elif len(shingles):
                        lsh.insert(global_row, sig, check_duplication=False)
                        kept_sets[global_row] = shingles
                        kept_ids[global_row] = str(ids[start + j])
                        kept_split[global_row] = split_of[path]
                        batch_kept.append(j)
                if config.semantic and batch_kept:
                    texts = _row_texts(part)
                    vectors.append(embed_rows([texts[j] for j in batch_kept], config.semantic_model))
                    semantic_rows += [row + start + j for j in batch_kept]
                if job is not None:
                    bar.advance(job, part.num_rows)
            row += table.num_rows
    semantic: list[SemanticPair] = []
    if semantic_rows:
        semantic = semantic_duplicates(lambda positions: _texts_at(files, [semantic_rows[p] for p in positions]),
                                       np.vstack(vectors), config)
    for pair in semantic:
        kept, duplicate = semantic_rows[pair.kept], semantic_rows[pair.duplicate]
        record = {"kept_id": kept_ids[kept], "kept_row": kept, "kept_split": kept_split[kept], "method": "semantic",
                  "similarity": pair.similarity, "word_share": pair.word_share, "shared_quantities": pair.quantities}
        # the row goes, and with it a mix's repeats of it (they follow their first copy)
        for dropped_row, dropped_id, split in [(duplicate, kept_ids[duplicate], kept_split[duplicate]),
                                               *later_copies.get(duplicate, [])]:
            dropped.add(dropped_row)
            pairs.append({**record, "duplicate_id": dropped_id, "duplicate_row": dropped_row, "duplicate_split": split})
    pairs.sort(key=lambda p: p["duplicate_row"])
    clusters = pa.Table.from_pylist(pairs, schema=CLUSTER_SCHEMA)
    n_clusters = len(set(clusters.column("kept_row").to_pylist()))
    result = DedupResult(rows_in, rows_in - len(dropped), clusters, dropped, 0.0, semantic_pairs=semantic)
    result.shares, result.warnings = share_shifts(train_tokens, dropped, token_column)
    for warning in result.warnings:
        console.print(f"[yellow]warning:[/] {warning}", highlight=False)
    if not dry_run:
        step.write_without_rows(
            shards, files, rows_in, dropped, why=("clusters.parquet", clusters), config=config.model_dump(),
            versions=("datasketch", *(("wordllama", "sentence-transformers") if config.semantic else ())),
            report=dedup_report(result, config), counts={"clusters": n_clusters},
            splits={split: [p.name for p in paths] for split, paths in by_split.items()},
            shares=result.shares, share_warnings=result.warnings,
        )
        result.out = step.out
    result.seconds = step.seconds
    if show_progress:
        table = Table(title="dedup")
        for col in ("rows in", "rows out", "dropped", "clusters", "rows/s"):
            table.add_column(col, justify="right")
        table.add_row(f"{rows_in:,}", f"{result.rows_out:,}", f"{len(dropped):,}", f"{n_clusters:,}",
                      f"{rows_in / max(result.seconds, 1e-9):,.0f}")
        print_result(table)
    return result


def _token_column(folder: str | Path) -> str:
    """The column a mix's shares count (its manifest's `basis`), else num_tokens (rows are counted
    where the shards have no such column)."""
    basis = read_manifest(folder).get("basis")
    return "num_trainable_tokens" if basis == "trainable" else "num_tokens"


def _row_tokens(table: pa.Table, column: str | None) -> list[tuple[str, int]]:
    sources = table.column("source").to_pylist() if "source" in table.column_names else ["?"] * table.num_rows
    if column not in table.column_names:
        return [(str(s), 1) for s in sources]
    return [(str(s), int(t or 0)) for s, t in zip(sources, table.column(column).to_pylist(), strict=True)]


def share_shifts(train_tokens: list[tuple[str, int]], dropped: set[int], column: str) -> tuple[list[dict], list[str]]:
    """Each source's share of the train tokens (rows without a token column) before and after
    dropping, and a warning for each that moved more than SHARE_SHIFT_PP points."""
    before, after = Counter(), Counter()
    for index, (source, tokens) in enumerate(train_tokens):  # train rows come first in global row order
        before[source] += tokens
        if index not in dropped:
            after[source] += tokens
    total_before, total_after = sum(before.values()) or 1, sum(after.values()) or 1
    unit = column if train_tokens and column else "rows"
    shares, warnings = [], []
    for source in sorted(before):
        old, new = before[source] / total_before, after[source] / total_after
        shift = 100 * (new - old)
        shares.append({"source": source, "before": round(old, 6), "after": round(new, 6), "shift_pp": round(shift, 4),
                       "unit": unit})
        if abs(shift) > SHARE_SHIFT_PP:
            warnings.append(f"dedup moved source {source!r} from {old:.1%} to {new:.1%} of the train {unit} "
                            f"({shift:+.1f} pp): the near duplicates were not spread evenly over the sources, so the "
                            "mix no longer has its token shares. Dedup belongs before mixing: dedup each source, then "
                            "mix (docs/data.md)")
    return shares, warnings


def dedup_report(result: DedupResult, config: DedupConfig) -> str:
    """The text of report.md: the counts and the largest clusters."""
    groups: dict[str, list[tuple[str, str]]] = {}
    by_stage = Counter()
    for pair in result.clusters.to_pylist():
        score = f"J {pair['jaccard']:.2f}" if pair["method"] == "minhash" else f"cos {pair['similarity']:.2f}"
        groups.setdefault(pair["kept_id"], []).append((pair["duplicate_id"], score))
        by_stage[pair["method"]] += 1
    semantic = (f"; with --semantic, rows that restate an earlier row in other words (cosine >= {config.semantic_min_cosine} "
                "and the same quantities, rufus_data/dedup_semantic.py)") if config.semantic else ""
    lines = ["# dedup report", "",
             (f"{result.rows_in:,} rows in, **{len(result.dropped):,} near duplicates dropped**, {result.rows_out:,} kept, "
              f"in {len(groups):,} clusters (Jaccard of {config.shingle}-word shingle sets >= {config.threshold}{semantic}; "
              "the first row of each cluster in input order is kept)."), "",
             "## Rows dropped, by stage", "", markdown_table(["stage", "rows dropped"], [
                 [stage, f"{by_stage[stage]:,}"] for stage in ("minhash", *(("semantic",) if config.semantic else ()))]), ""]
    if result.semantic_pairs:
        lines += ["Examples (semantic):", ""]
        for pair in result.semantic_pairs[:10]:
            lines.append(f"- cos {pair.similarity:.3f}, {pair.quantities} quantities shared, word Jaccard {pair.word_share:.2f} "
                         f"({', '.join(pair.shared_words[:4])})\n  kept: {pair.kept_text!r}\n  dropped: {pair.duplicate_text!r}")
        lines.append("")
    lines += ["## Largest clusters", "", "| kept row id | duplicates | their ids (Jaccard J or cosine) |", "| --- | ---: | --- |"]
    for kept, dups in sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0]))[:30]:
        lines.append(f"| {kept} | {len(dups)} | " + ", ".join(f"{d} ({score})" for d, score in dups[:5]) + " |")
    lines += ["", "clusters.parquet lists every dropped row with the kept row it duplicates and the stage (`method`) that dropped it.", ""]
    if result.shares:
        lines += ["## Token shares per source (train)", "",
                  markdown_table(["source", "before", "after", "change (pp)"],
                                 [[s["source"], f"{s['before']:.4f}", f"{s['after']:.4f}", f"{s['shift_pp']:+.2f}"]
                                  for s in result.shares]),
                  *(f"- **warning:** {w}" for w in result.warnings or
                    [f"every source is within {SHARE_SHIFT_PP:g} pp of its share before dedup"]), ""]
    return "\n".join(lines)
