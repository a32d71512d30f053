"""Stage 3 (semantic, off by default): training texts that restate an eval item in other words.

1. Retrieve: every eval problem and every training text field of at least `semantic_min_words`
   words is embedded (rufus_data/similarity/embedding.py); a field longer than `semantic_window`
   words is cut into windows of that many words (stride half a window), so an item inside a long
   prompt is compared with a window about its size. Each field or window gets its `semantic_top_k`
   nearest eval items by cosine (rufus_data/similarity/vector_search.py: exact, or clustered where
   the eval side is large). A span without any quantity (no digit, no number word) is compared
   only with the items the rule can pass without one (step 2), so on math benchmarks it is
   neither embedded nor searched.
2. Decide with evidence (rufus_data/similarity/semantic_evidence.py): a pair at or above
   `semantic_min_cosine` is a hit when the text keeps what a paraphrase keeps. An item with at least
   `semantic_min_quantities` quantities needs `semantic_quantity_share` of them and
   `semantic_word_share` of its content words (both weighted by rarity among the eval items); an item with fewer quantities
   (code, instructions) needs `semantic_few_quantities_cosine`, `semantic_few_quantities_word_share`
   and every quantity it has.
3. Optionally an LLM judge reads the pairs (semantic_judge.py, in the parent) and its verdict
   decides.

The thresholds are the ones measured by bench/decontam_semantic_bench.py (docs/decontam.md)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from rufus_data.base.paths import cached_pickle
from rufus_data.benchmarks import EvalItem
from rufus_data.decontam.candidates import Candidates
from rufus_data.decontam.config import DecontamConfig
from rufus_data.decontam.texts import FieldBatch
from rufus_data.similarity import embedding, ngram_hash, semantic_evidence, textnorm
from rufus_data.similarity.embedding import Embedder, load_embedder
from rufus_data.similarity.ngram_hash import TokenHasher
from rufus_data.similarity.semantic_evidence import (
    NUMBER_WORDS,
    Evidence,
    EvidenceModel,
    ItemEvidence,
    compare,
    content_words,
    may_hold_quantities,
    quantity_keys,
    word_share,
)
from rufus_data.similarity.vector_search import ClusteredSearch, ExactSearch, vector_search


def needed_word_share(config: DecontamConfig, item: ItemEvidence) -> float:
    """The share of the item's content words the evidence rule asks for."""
    if len(item.quantities) >= config.semantic_min_quantities:
        return config.semantic_word_share
    return config.semantic_few_quantities_word_share


def needs_quantity(config: DecontamConfig, item: ItemEvidence) -> bool:
    """Whether the evidence rule refuses this item for a text that holds no quantity at all."""
    if len(item.quantities) >= config.semantic_min_quantities:
        return config.semantic_quantity_share > 0
    return len(item.quantities) > 0


def decide(config: DecontamConfig, item: ItemEvidence, similarity: float, evidence: Evidence) -> bool:
    """The evidence rule (step 2 of the module docstring)."""
    if similarity < config.semantic_min_cosine or evidence.word_share < needed_word_share(config, item):
        return False
    if len(item.quantities) >= config.semantic_min_quantities:
        return evidence.quantity_share >= config.semantic_quantity_share
    return similarity >= config.semantic_few_quantities_cosine and evidence.quantities_kept == len(item.quantities)


@dataclass
class SemanticIndex:
    """The eval side: one vector and one set of evidence per item, and the search over the vectors."""

    model: str
    vectors: np.ndarray
    evidence: list[ItemEvidence]
    search: ExactSearch | ClusteredSearch
    open_items: np.ndarray  # the items the rule can pass without a quantity (code, instructions)
    open_search: ExactSearch | ClusteredSearch | None  # the search over their vectors (None: there are none)
    number_word_ids: np.ndarray  # TokenHasher ids of NUMBER_WORDS

    def stats(self) -> dict:
        return {"semantic_model": self.model, "semantic_dim": int(self.vectors.shape[1]),
                "semantic_search": type(self.search).__name__}


def build_semantic_index(items: list[EvalItem], config: DecontamConfig) -> SemanticIndex:
    """Embed every eval item's problem text and learn the evidence of each item."""
    texts = ["\n".join(item.problems) for item in items]
    vectors, evidence = eval_side(texts, config.semantic_model)
    open_items = np.flatnonzero([not needs_quantity(config, e) for e in evidence])
    open_search = vector_search(vectors[open_items], config.semantic_clustered_from) if len(open_items) else None
    return SemanticIndex(config.semantic_model, vectors, evidence, vector_search(vectors, config.semantic_clustered_from),
                         open_items, open_search, TokenHasher()(sorted(NUMBER_WORDS)))


# the code whose output the eval-side cache holds: a change to any of it is a cache miss
_CACHED_CODE = (embedding, semantic_evidence, textnorm, ngram_hash)


def eval_side(texts: list[str], model: str) -> tuple[np.ndarray, list[ItemEvidence]]:
    """The vectors and evidence of the eval texts. For the built-in embedder they are kept in
    `$RUFUS_CACHE/decontam/` (about 1 s for GSM8K test's 1,319 items, paid by every decontam
    command otherwise), keyed by the texts, the wordllama version and the code that computes them;
    a sentence-transformers model is computed each time (its files can change under its name)."""
    embedder = load_embedder(model)
    version = getattr(embedder, "version", None)
    if version is None:
        return embedder.embed(texts), EvidenceModel(texts).items(texts)
    return cached_pickle("decontam/semantic", [model, version, texts], _CACHED_CODE,
                         lambda: (embedder.embed(texts), EvidenceModel(texts).items(texts)), types=(ItemEvidence,))


@dataclass
class SemanticMatch:
    """A (training field, eval item) pair at or above the cosine floor, with its evidence."""

    field: int  # index of the field in the batch
    item: int
    similarity: float
    evidence: Evidence
    passed: bool  # the evidence rule's verdict
    text: str  # the field or window that matched (normalised words), for the judge


def spans(offsets: np.ndarray, window: int, min_words: int = 1) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Windows over every field: (field of each span, start, stop) in flat word positions. A field
    of at most `window` words is one span; a longer one is cut every window/2 words, the last
    window ending at the field's end. Fields under `min_words` words get none."""
    lengths = np.diff(offsets)
    stride = max(1, window // 2)
    counts = np.where(lengths <= window, 1, -(-(lengths - window) // stride) + 1)
    counts[lengths < max(1, min_words)] = 0
    field = np.repeat(np.arange(len(lengths)), counts)
    rank = np.arange(len(field)) - np.repeat(np.cumsum(counts) - counts, counts)
    first, end = offsets[:-1][field], offsets[1:][field]
    start = np.minimum(first + rank * stride, np.maximum(first, end - window))  # the last window is a full one
    return field, start, np.minimum(start + window, end)


def span_vectors(embedder: Embedder, tokens: pa.Array, ids: np.ndarray, start: np.ndarray, stop: np.ndarray) -> np.ndarray:
    """Vectors of word spans of the flat token array (wordllama's fast path, else the joined words)."""
    if hasattr(embedder, "embed_spans"):
        return embedder.embed_spans(tokens, ids, start, stop)
    words = tokens.to_pylist()
    return embedder.embed([" ".join(words[a:b]) for a, b in zip(start.tolist(), stop.tolist())])


def match_fields(tokens: pa.Array, ids: np.ndarray, offsets: np.ndarray, index: SemanticIndex,
                 config: DecontamConfig, keep_failed: bool = False) -> list[SemanticMatch]:
    """Steps 1 and 2 for a batch of fields (normalised words `tokens`, their hashes `ids`; field t
    is `[offsets[t], offsets[t+1])`). Returns the best span of each (field, item) pair that
    passed the rule and, with `keep_failed`, the best of those that did not (for the judge)."""
    embedder = load_embedder(index.model)
    field, start, stop = spans(offsets, config.semantic_window, config.semantic_min_words)
    groups = [(np.arange(len(field)), index.search, None)]  # (spans, the search they get, its item numbers)
    if not keep_failed:  # a span without any quantity can pass only the items that need none: only they are searched
        maybe = np.concatenate(([0], np.cumsum(may_hold_quantities(tokens, ids, index.number_word_ids))))
        holds = maybe[stop] > maybe[start]
        groups = [(np.flatnonzero(holds), index.search, None)]
        if index.open_search is not None:
            groups.append((np.flatnonzero(~holds), index.open_search, index.open_items))
    best: dict[tuple[int, int], SemanticMatch] = {}
    for chosen, search, item_of in groups:
        for lo in range(0, len(chosen), config.semantic_batch_spans):
            part = chosen[lo : lo + config.semantic_batch_spans]
            vectors = span_vectors(embedder, tokens, ids, start[part], stop[part])
            queries, found, similarity = search.search(vectors, config.semantic_top_k, config.semantic_min_cosine)
            _decide_pairs(tokens, field, start, stop, part[queries], found if item_of is None else item_of[found],
                          similarity, index, config, keep_failed, best)
    return [m for m in best.values() if m.passed or keep_failed]


def _decide_pairs(tokens: pa.Array, field: np.ndarray, start: np.ndarray, stop: np.ndarray, span_of: np.ndarray,
                  found: np.ndarray, similarity: np.ndarray, index: SemanticIndex, config: DecontamConfig,
                  keep_failed: bool, best: dict[tuple[int, int], SemanticMatch]) -> None:
    """Step 2 for the retrieved (span, item) pairs: keep the best of each (field, item) in `best`."""
    sides: dict[int, tuple[list[str], set[str]]] = {}  # per span: its words, content words
    quantities: dict[int, set[str]] = {}  # per span: its quantities, read only when a pair needs them
    for s, item, sim in zip(span_of.tolist(), found.tolist(), similarity.tolist()):
        key = (int(field[s]), item)
        old = best.get(key)
        if old is not None and old.passed and old.similarity >= sim:
            continue
        if s not in sides:
            words = tokens.slice(int(start[s]), int(stop[s] - start[s])).to_pylist()
            sides[s] = (words, content_words(words))
        words, stems = sides[s]
        item_evidence = index.evidence[item]
        if not keep_failed and word_share(item_evidence, stems) < needed_word_share(config, item_evidence):
            continue  # fails the rule on its words: nobody reads this pair (the judge would)
        if s not in quantities:
            quantities[s] = quantity_keys(words)
        evidence = compare(item_evidence, quantities[s], stems)
        passed = decide(config, item_evidence, sim, evidence)
        if old is None or (passed, sim) > (old.passed, old.similarity):
            best[key] = SemanticMatch(key[0], item, round(sim, 4), evidence, passed, " ".join(words))


def scan_semantic(batch: FieldBatch, index: SemanticIndex, config: DecontamConfig, found: Candidates) -> None:
    """Stage 3 for one batch of rows: record the best semantic match of each (row, item) pair. With
    a judge, pairs the rule turned down but at or above `judge_min_cosine` travel too."""
    judged = config.judge_url is not None
    for m in match_fields(batch.tokens, batch.ids, batch.offsets, index, config, keep_failed=judged):
        if not m.passed and m.similarity < config.judge_min_cosine:
            continue
        c = found.at(int(batch.row_of[m.field]), m.item)
        if c.evidence is None or (m.passed, m.similarity) > (c.semantic_passed, c.similarity):
            c.similarity, c.evidence, c.semantic_passed, c.semantic_text = m.similarity, m.evidence, m.passed, m.text
            c.semantic_field = batch.names[m.field]
