"""The tokenised texts the stages see, normalised once by rufus_data/similarity/textnorm.py: `EvalTexts`
(every problem and answer of the eval items) when the index is built, `FieldBatch` (every text
field of a batch of training rows) when rows are scanned. Both sides go through the same
tokeniser and token hasher, so a gram or shingle hash means the same words on either side."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from rufus_data.benchmarks import EvalItem
from rufus_data.similarity.ngram_hash import TokenHasher, tokenize_batch
from rufus_data.similarity.text_fields import text_fields

PROBLEM, ANSWER = "problem", "answer"


@dataclass
class EvalTexts:
    """Every problem and answer text of the eval items, tokenised in one batch."""

    items: list[EvalItem]
    owners: list[tuple[int, str]]  # per text: (item index, PROBLEM or ANSWER)
    tokens: pa.Array  # every normalised word of every text, flat
    ids: np.ndarray  # their 64-bit token ids
    offsets: np.ndarray  # text t is ids[offsets[t]:offsets[t + 1]]
    family: np.ndarray  # per item: its family (perturbations of one seed question are one family)
    n_families: int

    @classmethod
    def of(cls, items: list[EvalItem], hasher: TokenHasher) -> EvalTexts:
        texts, owners = [], []
        for i, item in enumerate(items):
            texts += [*item.problems, *item.answers]
            owners += [(i, PROBLEM)] * len(item.problems) + [(i, ANSWER)] * len(item.answers)
        tokens, ids, offsets = tokenize_batch(texts, hasher)
        family_of: dict[tuple[str, str], int] = {}
        family = np.asarray([family_of.setdefault((it.benchmark, it.group or f"\0{it.item_id}"), len(family_of))
                             for it in items], dtype=np.int64)
        return cls(items, owners, tokens, ids, offsets, family, len(family_of))

    def text_ids(self, t: int) -> np.ndarray:
        return self.ids[self.offsets[t] : self.offsets[t + 1]]


@dataclass
class FieldBatch:
    """Every non-empty text field of a batch of canonical rows, tokenised in one pass."""

    tokens: pa.Array  # every normalised word of every field, flat
    ids: np.ndarray  # their 64-bit token ids
    offsets: np.ndarray  # field t is ids[offsets[t]:offsets[t + 1]]
    row_of: np.ndarray  # per field: its row in the batch
    names: list[str]  # per field: its name (`messages[1].assistant`, `prompt`, ...)

    @classmethod
    def of(cls, table: pa.Table, hasher: TokenHasher) -> FieldBatch | None:
        """None when the rows hold no text at all."""
        texts, row_of, names = text_fields(table)
        if not texts:
            return None
        tokens, ids, offsets = tokenize_batch(texts, hasher)
        return cls(tokens, ids, offsets, row_of, names)

    def row_token_ids(self, row: int) -> np.ndarray:
        """The token ids of all fields of one row, concatenated."""
        parts = [self.ids[self.offsets[t] : self.offsets[t + 1]] for t in np.flatnonzero(self.row_of == row)]
        return np.concatenate(parts) if parts else np.empty(0, np.uint64)
