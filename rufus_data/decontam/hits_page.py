"""hits.html: every decontam hit as a card, the training text beside the benchmark item it
matched, the words they share marked, the stage that caught it and its score, filterable by
benchmark and stage (rufus_data/folders/review_page.py writes the page). What marks a span follows the
stage: the exact stage's n-gram length for exact hits, runs of `MINHASH_RUN` words for MinHash
hits (whose shingles are too short to mark alone), the shared words for semantic hits."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from rufus_data.benchmarks import EvalItem
from rufus_data.decontam.config import DecontamConfig
from rufus_data.decontam.report import SEMANTIC, STAGES, evidence_text
from rufus_data.folders.review_page import card, escape, highlight_shared, page, words_with_spans
from rufus_data.similarity.text_fields import text_fields

HITS_PAGE = "hits.html"
MINHASH_RUN = 4
MAX_CHARS = 6000  # per text shown: a long row is cut, and the page says so


def row_fields(files: list[Path], rows: set[int]) -> dict[int, list[tuple[str, str]]]:
    """Global row number (over `files` in order) -> its text fields, (name, text), for `rows` only."""
    found: dict[int, list[tuple[str, str]]] = defaultdict(list)
    wanted = np.asarray(sorted(rows), dtype=np.int64)
    first = 0
    for path in files:
        count = pq.read_metadata(path).num_rows
        lo, hi = np.searchsorted(wanted, [first, first + count])
        if hi > lo:
            table = pq.read_table(path).take(pa.array(wanted[lo:hi] - first))
            texts, owners, names = text_fields(table)
            for text, owner, name in zip(texts, owners.tolist(), names):
                found[int(wanted[lo + owner])].append((name, text))
        first += count
    return found


def shown(text: str) -> str:
    return text if len(text) <= MAX_CHARS else text[:MAX_CHARS] + f"\n[... {len(text) - MAX_CHARS:,} more characters]"


def card_texts(hit: dict, fields: list[tuple[str, str]], item: EvalItem | None) -> tuple[str, list[str]]:
    """The training side of a hit's card (the fields it matched, or all) and the item's texts."""
    named = [(name, text) for name, text in fields if name in set(hit["fields"])] or fields
    training = "\n\n".join(f"[{name}]\n{shown(text)}" for name, text in named)
    return training, [shown(text) for text in ((*item.problems, *item.answers) if item else ())]


def hit_card(hit: dict, item: EvalItem | None, texts: tuple[str, list[str]], config: DecontamConfig,
             words: dict | None = None) -> str:
    """One hit's card; `texts` is card_texts' (training side, item texts), `words` the page's."""
    training, item_texts = texts
    only = None
    if hit["method"] == SEMANTIC:
        only = set((hit.get("evidence") or {}).get("shared_words") or [])
    n = config.ngram if hit["method"] == "exact" else MINHASH_RUN
    left, right = highlight_shared(training, item_texts, n, only, words)
    labels = [f"problem {i + 1}" for i in range(len(item.problems))] + [f"answer {i + 1}" for i in range(len(item.answers))] \
        if item else []
    benchmark_side = "\n\n".join(f"[{label}]\n{body}" for label, body in zip(labels, right)) or "(item not loaded)"
    score = f"{hit['containment']:.2f}"
    evidence = evidence_text(hit) if hit["method"] == SEMANTIC else f"{hit['n_matched']} n-grams matched"
    meta = (f'<span class="tag stage">{escape(hit["method"])}</span><span class="tag">{escape(hit["benchmark"])}</span>'
            f'row <b>{escape(hit["row_id"])}</b> ({escape(hit["source"])}, {escape(hit.get("split") or "train")}) '
            f'matched item <b>{escape(hit["eval_item_id"])}</b>; score <b class="score">{score}</b>'
            f'{"; answer matched" if hit["answer_hit"] else ""}; {escape(evidence)}')
    return card({"benchmark": hit["benchmark"], "stage": hit["method"]}, meta,
                [(f"training row {hit['row_id']}", left), (f"{hit['benchmark']} item {hit['eval_item_id']}", benchmark_side)])


def hits_page(hits: pa.Table, files: list[Path], items: list[EvalItem], config: DecontamConfig) -> str:
    """The page of every hit in `hits` (decontam's table: rules.HIT_SCHEMA plus split)."""
    by_key = {(item.benchmark, item.item_id): item for item in items}
    rows = hits.to_pylist()
    fields = row_fields(files, {hit["row"] for hit in rows})
    items_of = [by_key.get((hit["benchmark"], hit["eval_item_id"])) for hit in rows]
    texts = [card_texts(hit, fields.get(hit["row"], []), item) for hit, item in zip(rows, items_of)]
    distinct = list(dict.fromkeys(text for training, item_texts in texts for text in (training, *item_texts)))
    words = dict(zip(distinct, words_with_spans(distinct)))  # one pass for the page
    cards = [hit_card(hit, item, side, config, words) for hit, item, side in zip(rows, items_of, texts)]
    benchmarks = sorted({hit["benchmark"] for hit in rows})
    stages = [stage for stage in STAGES if any(hit["method"] == stage for hit in rows)]
    flagged = len({hit["row"] for hit in rows})
    intro = (f"{len(rows):,} hits on {flagged:,} training rows. Marked: the words the training row shares with the "
             f"benchmark item (runs of {config.ngram} words for the exact stage, {MINHASH_RUN} for MinHash, the shared "
             "words for the semantic stage). A real leak reads as the same problem; a shared phrase alone is not one."
             if rows else "No hits: no training row matched a benchmark item.")
    return page("decontam hits", escape(intro), {"benchmark": ("benchmark", benchmarks), "stage": ("stage", stages)}, cards)
