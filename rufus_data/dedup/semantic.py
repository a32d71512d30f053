"""`rufus-data dedup --semantic`: rows that say the same thing in other words.

MinHash (rufus_data/dedup/) finds rows that share most of their word shingles; a reworded
row shares almost none. This second stage runs over the rows MinHash kept, with the embedder of
the semantic decontam stage (rufus_data/similarity/embedding.py, offline) and its paraphrase evidence
(rufus_data/similarity/semantic_evidence.py):

1. every row (all its text fields, one vector) is embedded, and each row's `semantic_top_k`
   nearest rows at cosine >= `semantic_min_cosine` are found (rufus_data/similarity/vector_search.py);
2. a later row duplicates an earlier kept row when the pair keeps what a rewording keeps: the
   same quantities (digits, written-out numbers and unit changes alike: every quantity of one
   row is in the other, and every quantity of either but a 0 or 1, since a rewording may add a
   "one" of its own: "a week" -> "one week"), and overlapping content words (Jaccard of stems
   >= `semantic_word_share`). The quantities carry the decision only where both rows
   have at least two and one of them is not a small integer ("2 tables" and "3 steps" are in
   every other row); other rows are duplicates only when they hold the same quantities and are
   worded nearly the same (cosine >= `semantic_few_quantities_cosine`, Jaccard >=
   `semantic_few_quantities_word_share`): a static embedding cannot tell "the highest salary"
   from "the second highest salary".

Rows are decided in input order, so the first row of each group is the one kept, as in the
MinHash stage. Measured in bench/decontam_semantic_bench.py and docs/decontam.md."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property

import numpy as np
import pyarrow as pa

from rufus_data.base.engines import RowGroupTask
from rufus_data.dedup.rows import rows_at
from rufus_data.similarity.embedding import load_embedder
from rufus_data.similarity.ngram_hash import distinct
from rufus_data.similarity.semantic_evidence import content_words, item_quantities, normalised_words
from rufus_data.similarity.text_fields import text_fields
from rufus_data.similarity.vector_search import ClusteredSearch, top_k_above

SMALL_INTEGERS = 12  # quantities 0..12 (integers) say little about which problem a row is
ADDED_BY_REWORDING = 1  # a rewording may add quantities up to this ("a week" -> "one week")
SCORE_CELLS = 1 << 24  # the most query x row cosines held at once (64 MB)
TEXT_SHOWN = 200  # characters of each text a pair carries to the report


class RowEvidence:
    """What one row brings to a comparison: its content stems, and (read when a pair's words
    agree, most do not) its quantities (value, keys that keep it) and every quantity key it holds."""

    def __init__(self, words: list[str]):
        self.words = words  # normalised
        self.stems = frozenset(content_words(words))

    @cached_property
    def quantities(self) -> tuple[tuple[str, frozenset[str]], ...]:
        return item_quantities(self.words)

    @cached_property
    def quantity_keys(self) -> frozenset[str]:
        return frozenset().union(*(keys for _, keys in self.quantities))  # every key of quantity_keys(words)

    def distinctive(self) -> int:
        """How many of its quantities are not small integers."""
        return sum(not _small(v) for v, _ in self.quantities)

    def found_in(self, other: RowEvidence) -> list[bool]:
        """Whether each of its quantities is in the other row (in any of its forms)."""
        return [not keys.isdisjoint(other.quantity_keys) for _, keys in self.quantities]


def _small(value: str, up_to: int = SMALL_INTEGERS) -> bool:
    number = float(value)
    return number.is_integer() and 0 <= number <= up_to


@dataclass(frozen=True)
class SemanticPair:
    """A later row found to restate an earlier kept one."""

    kept: int  # position in the stage's rows
    duplicate: int
    similarity: float
    quantities: int  # quantities the two rows share
    word_share: float  # Jaccard of their content stems
    shared_words: tuple[str, ...]
    kept_text: str  # the start of each text, for the report
    duplicate_text: str


def _restates(kept: RowEvidence, row: RowEvidence, similarity: float, config) -> tuple[bool, float]:
    """The rule of step 2 (module docstring) and the pair's word Jaccard."""
    union = len(kept.stems | row.stems)
    jaccard = round(len(kept.stems & row.stems) / union, 4) if union else 0.0
    if jaccard < min(config.semantic_word_share, config.semantic_few_quantities_word_share):
        return False, jaccard  # fails on its words whatever its quantities
    kept_found, row_found = kept.found_in(row), row.found_in(kept)
    if min(len(kept.quantities), len(row.quantities)) >= 2 and min(kept.distinctive(), row.distinctive()) >= 1:
        # the distinctive quantities both ways; all of one row's in the other (a rewording may add a
        # small number of its own: "a week" -> "one week")
        same = (all(f or _small(v, ADDED_BY_REWORDING) for (v, _), f in zip(kept.quantities, kept_found))
                and all(f or _small(v, ADDED_BY_REWORDING) for (v, _), f in zip(row.quantities, row_found))
                and (all(kept_found) or all(row_found)))
        return same and jaccard >= config.semantic_word_share, jaccard
    return (all(kept_found) and all(row_found) and similarity >= config.semantic_few_quantities_cosine
            and jaccard >= config.semantic_few_quantities_word_share), jaccard


def nearest_earlier(vectors: np.ndarray, config) -> dict[int, list[tuple[int, float]]]:
    """For each row, its nearest earlier rows at or above the cosine floor, best first: exact
    below `semantic_clustered_from` rows (each block of rows against the rows before it only),
    the clustered index from there on."""
    clustered = ClusteredSearch(vectors) if len(vectors) >= config.semantic_clustered_from else None
    block = max(1, SCORE_CELLS // max(1, len(vectors)))
    found: dict[int, list[tuple[int, float]]] = {}
    for lo in range(0, len(vectors), block):
        hi = min(lo + block, len(vectors))
        if clustered is not None:
            queries, rows, cosines = clustered.search(vectors[lo:hi], config.semantic_top_k + 1, config.semantic_min_cosine)
        else:
            scores = vectors[lo:hi] @ vectors[:hi].T
            scores[:, lo:hi][np.triu_indices(hi - lo)] = -np.inf  # itself and the later rows of the block
            queries, rows, cosines = top_k_above(scores, config.semantic_top_k, config.semantic_min_cosine)
        for q, r, c in zip((queries + lo).tolist(), rows.tolist(), cosines.tolist()):
            if r < q:  # earlier rows only (the clustered index also returns the row itself and later ones)
                found.setdefault(q, []).append((r, c))
    return found


def semantic_duplicates(texts_of: Callable[[list[int]], list[str]], vectors: np.ndarray, config) -> list[SemanticPair]:
    """The later rows that restate an earlier kept row (positions into `vectors`, in input
    order). `texts_of(positions)` gives the text of those rows: only rows in a candidate pair
    are read again."""
    candidates = nearest_earlier(vectors, config)
    needed = sorted({p for q, near in candidates.items() for p in (q, *(r for r, _ in near))})
    texts = dict(zip(needed, texts_of(needed)))
    evidence = {p: RowEvidence(w) for p, w in zip(needed, normalised_words([texts[p] for p in needed]))}
    dropped: set[int] = set()
    pairs = []
    for row in sorted(candidates):
        for kept, similarity in candidates[row]:
            if kept in dropped:
                continue
            passed, jaccard = _restates(evidence[kept], evidence[row], similarity, config)
            if passed:
                shared = sorted(evidence[kept].stems & evidence[row].stems, key=lambda s: (-len(s), s))
                n_quantities = sum(not keys.isdisjoint(evidence[row].quantity_keys) for _, keys in evidence[kept].quantities)
                pairs.append(SemanticPair(kept, row, round(similarity, 4), n_quantities, jaccard, tuple(shared[:6]),
                                          texts[kept][:TEXT_SHOWN], texts[row][:TEXT_SHOWN]))
                dropped.add(row)
                break
    return pairs


def embed_rows(texts: list[str], model: str) -> np.ndarray:
    """One unit vector per row text."""
    return load_embedder(model).embed(texts)


def row_texts(table: pa.Table) -> list[str]:
    """One text per row: its text fields, one per line (what the semantic stage embeds)."""
    texts, row_of, _ = text_fields(table)
    parts: list[list[str]] = [[] for _ in range(table.num_rows)]
    for text, row in zip(texts, np.asarray(row_of).tolist()):
        parts[row].append(text)
    return ["\n".join(p) for p in parts]


def texts_at(tasks: list[RowGroupTask], rows: np.ndarray) -> list[str]:
    """The texts of some global rows, read again from the shards (only the rows of candidate
    pairs are read, so no text is held for the whole run)."""
    found: dict[int, str] = {}
    for wanted, table in rows_at(tasks, distinct(rows)):
        found.update(zip(wanted.tolist(), row_texts(table)))
    return [found[r] for r in rows.tolist()]


def semantic_stage(tasks: list[RowGroupTask], compared: np.ndarray, config) -> tuple[np.ndarray, list[SemanticPair]]:
    """(the rows compared, the pairs found among them, as positions into those rows): every row
    whose `compared` flag is set (kept by MinHash, with words, no repeat) is embedded, in input order."""
    vectors: list[np.ndarray] = []
    rows: list[np.ndarray] = []
    for task in tasks:
        for first, table in task.batches():
            local = np.flatnonzero(compared[first : first + table.num_rows])
            if len(local):
                vectors.append(embed_rows(row_texts(table.take(pa.array(local))), config.semantic_model))
                rows.append(first + local)
    if not rows:
        return np.empty(0, np.int64), []
    stage_rows = np.concatenate(rows)
    pairs = semantic_duplicates(lambda positions: texts_at(tasks, stage_rows[np.asarray(positions, dtype=np.int64)]),
                                np.vstack(vectors), config)
    return stage_rows, pairs
