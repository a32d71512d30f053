"""Scanning one batch of training rows: every stage in turn adds candidates, then the short
answers of the items already hit are looked for; only candidates that can still pass the final
rules travel back to the parent."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from rufus_data.decontam.candidates import Candidate, Candidates
from rufus_data.decontam.exact_stage import scan_exact
from rufus_data.decontam.index import EvalIndex
from rufus_data.decontam.minhash_stage import scan_minhash
from rufus_data.decontam.numbers_stage import scan_numbers
from rufus_data.decontam.rules import may_count
from rufus_data.decontam.semantic_stage import scan_semantic
from rufus_data.decontam.texts import FieldBatch
from rufus_data.similarity.ngram_hash import TokenHasher


def scan_table(table: pa.Table, index: EvalIndex, first_row: int, hasher: TokenHasher | None = None) -> list[Candidate]:
    """Every stage on one batch of canonical rows; returns raw candidates for the parent."""
    hasher = hasher or TokenHasher()
    batch = FieldBatch.of(table, hasher)
    if batch is None:
        return []
    row_ids = (table.column("id").to_pylist() if "id" in table.column_names
               else [str(first_row + i) for i in range(table.num_rows)])
    sources = table.column("source").to_pylist() if "source" in table.column_names else [""] * table.num_rows
    found = Candidates(first_row, row_ids, sources)
    scan_exact(batch, index.exact, found)
    scan_minhash(batch, index.minhash, index.config, found)
    if index.config.short_numbers:
        scan_numbers(batch, index.numbers, hasher, found)
    if index.semantic is not None:
        scan_semantic(batch, index.semantic, index.config, found)
    _short_answers(batch, index, found)
    return [c for c in found.found.values() if may_count(c, index)]


def _short_answers(batch: FieldBatch, index: EvalIndex, found: Candidates) -> None:
    """A short answer ("42") counts only in a row where the same item's problem hit (exactly, by
    MinHash, or by the semantic rule)."""
    short = index.exact.short_answers
    if not short:
        return
    row_tokens: dict[int, np.ndarray] = {}
    for (row, item), c in found.found.items():
        if item in short and (c.problem_grams or c.containment >= index.config.containment or c.semantic_passed):
            if row not in row_tokens:
                row_tokens[row] = batch.row_token_ids(row)
            c.short_answer_hit = any(_contains(row_tokens[row], answer) for answer in short[item])


def _contains(haystack: np.ndarray, needle: np.ndarray) -> bool:
    """Whether token-id sequence `needle` occurs in `haystack`."""
    m = len(needle)
    if m == 0 or len(haystack) < m:
        return False
    starts = np.flatnonzero(haystack[: len(haystack) - m + 1] == needle[0])
    return any(np.array_equal(haystack[s : s + m], needle) for s in starts)
