"""A narrow second look of decontam at short items with their numbers changed. An item of fewer
than `short_item_words` words leaves too few n-grams and shingles for the exact and MinHash
stages to see it once a number is changed (`Convert $\\frac{57}{160}$ to a terminating decimal.`
as `$\\frac{58}{160}$`). Every run of digits in such an item's words is masked (`$\\frac{#}{#}$`),
and a training field that holds the whole masked item is a candidate of its own kind (`numbers`,
rules.py): the same short problem with other numbers, which a user may keep (`short_numbers: false`).
Masked items shared by many item families ("what is #% of #") are boilerplate, as in the exact stage."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from rufus_data.decontam.candidates import Candidates
from rufus_data.decontam.config import DecontamConfig
from rufus_data.decontam.exact_stage import Postings, gram_postings, indexed_grams, low_bits_filter
from rufus_data.decontam.texts import PROBLEM, EvalTexts, FieldBatch
from rufus_data.similarity.ngram_hash import TokenHasher, gram_hashes

DIGITS = "[0-9]+"


@dataclass
class NumbersIndex:
    """The masked short items: their whole-text gram hashes by length, and who holds each."""

    gram_lengths: list[int]  # longest first
    keys: dict[int, np.ndarray]  # length -> sorted masked gram hashes
    filters: dict[int, tuple[np.ndarray, np.uint64]]
    postings: Postings
    items: int = 0  # short items indexed


def masked_ids(tokens: pa.Array, ids: np.ndarray, hasher: TokenHasher) -> np.ndarray:
    """The token ids with every run of digits in a word masked (`$\\frac{57}{160}$` -> `$\\frac{#}{#}$`);
    words without a digit keep their id."""
    if not len(tokens):
        return ids.copy()
    digits = np.flatnonzero(pc.match_substring_regex(tokens, DIGITS).to_numpy(zero_copy_only=False))
    out = ids.copy()
    if len(digits):
        out[digits] = hasher(pc.replace_substring_regex(tokens.take(pa.array(digits)), DIGITS, "#"))
    return out


def build_numbers_index(texts: EvalTexts, config: DecontamConfig) -> NumbersIndex:
    """Every problem shorter than `short_item_words` words with a digit and a word of letters, as one
    masked gram of all its words."""
    lengths = np.diff(texts.offsets)
    masked = masked_ids(texts.tokens, texts.ids, TokenHasher())
    has_digit = np.concatenate(([0], np.cumsum(masked != texts.ids)))
    letters = np.concatenate(([0], np.cumsum(pc.match_substring_regex(texts.tokens, r"\pL").to_numpy(zero_copy_only=False)
                                             if len(texts.tokens) else np.zeros(0, np.int64))))
    starts, ends = texts.offsets[:-1], texts.offsets[1:]
    problem = np.asarray([kind == PROBLEM for _, kind in texts.owners], dtype=bool)
    short = np.flatnonzero(problem & (lengths > 0) & (lengths < config.short_item_words)
                           & (has_digit[ends] > has_digit[starts]) & (letters[ends] > letters[starts]))
    grams = np.asarray([gram_hashes(masked[starts[t] : ends[t]], int(lengths[t]))[0] for t in short.tolist()], dtype=np.uint64)
    items = np.asarray([texts.owners[t][0] for t in short.tolist()], dtype=np.int64)
    postings, keys, _ = gram_postings(grams, items, np.zeros(len(short), bool), lengths[short], starts[short],
                                      config.max_items_per_gram, texts.family)
    filters = {length: low_bits_filter(k) for length, k in keys.items()}
    return NumbersIndex(sorted(keys, reverse=True), keys, filters, postings, len(set(items.tolist())))


def scan_numbers(batch: FieldBatch, index: NumbersIndex, hasher: TokenHasher, found: Candidates) -> None:
    """Every field's masked words looked up as the exact stage looks up grams: a field that holds a
    whole masked short item is a candidate (`numbers_hit`)."""
    if not index.gram_lengths:
        return
    masked = masked_ids(batch.tokens, batch.ids, hasher)
    for _, grams, hit, owner in indexed_grams(masked, batch.offsets, index):
        for t, entries in zip(owner.tolist(), index.postings.lookup_many(grams[hit])):
            for item, _, _ in entries:
                c = found.at(int(batch.row_of[t]), item)
                c.fields.add(batch.names[t])
                c.numbers_hit = True
