"""Hashes of normalised words (textnorm.py) and of their n-grams: 64-bit token ids
from polars' seeded vectorised string hash, n-grams as polynomial rolling hashes of the token
ids in numpy, and the 32-bit shingles that MinHash takes. decontam's exact stage looks grams up
with these; the MinHash stage, dedup and the embedder's word cache build on them."""

from __future__ import annotations

import numpy as np
import polars as pl
import pyarrow as pa

from rufus_data.similarity.textnorm import tokenize_array

_MULT = np.uint64(0x9E3779B97F4A7C15)  # odd 64-bit multiplier of the rolling n-gram hash
_MASK32 = np.uint64(0xFFFFFFFF)


class TokenHasher:
    """64-bit ids for tokens: polars' vectorised string hash with fixed seeds, so the same token
    gets the same id in every process of a run (workers, Ray tasks) that uses the same polars
    version; the eval index and the scan are always built within one run."""

    SEED = 0x5EED

    def __call__(self, tokens) -> np.ndarray:
        if not isinstance(tokens, (pa.Array, pa.ChunkedArray)):
            tokens = pa.array(tokens, pa.large_string())
        if not len(tokens):
            return np.empty(0, dtype=np.uint64)
        return pl.from_arrow(tokens).hash(self.SEED).to_numpy().astype(np.uint64, copy=False)


def tokenize_batch(texts: list[str], hasher: TokenHasher) -> tuple[pa.Array, np.ndarray, np.ndarray]:
    """All normalised words of the texts (flat), their 64-bit ids, and each text's start offset."""
    flat, offsets = tokenize_array(pa.array(texts, pa.large_string()))
    return flat, hasher(flat), offsets


def gram_hashes(token_ids: np.ndarray, n: int) -> np.ndarray:
    """Rolling hashes of every n-gram of one token-id array (empty if shorter than n)."""
    length = len(token_ids) - n + 1
    if length <= 0:
        return np.empty(0, dtype=np.uint64)
    acc = token_ids[:length].copy()
    with np.errstate(over="ignore"):
        for j in range(1, n):
            acc = acc * _MULT + token_ids[j : j + length]
    return acc


def batch_gram_hashes(token_ids: np.ndarray, offsets: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """n-gram hashes for many texts at once.

    `token_ids` is all texts' tokens concatenated, `offsets` the start of each text (len = texts + 1).
    Returns (hashes, text index of each hash); grams never cross a text boundary. The rolling
    hash runs over the whole concatenation with slices (no gathers), then boundary grams go."""
    total = len(token_ids) - n + 1
    if total <= 0:
        return np.empty(0, dtype=np.uint64), np.empty(0, dtype=np.int64)
    acc = token_ids[:total].copy()
    with np.errstate(over="ignore"):
        for j in range(1, n):
            acc *= _MULT
            acc += token_ids[j : j + total]
    lengths = np.diff(offsets)
    owner = np.repeat(np.arange(len(lengths)), lengths)[:total]
    valid = np.arange(total) + n <= offsets[1:][owner]
    return acc[valid], owner[valid]


def whole_text_hashes(token_ids: np.ndarray, offsets: np.ndarray, texts: np.ndarray) -> np.ndarray:
    """The hash of each of `texts` (indices into `offsets`) as one gram of all its words: what
    `gram_hashes(ids, len(ids))` gives for each, for texts shorter than a shingle."""
    out = np.empty(len(texts), dtype=np.uint64)
    lengths = offsets[texts + 1] - offsets[texts]
    for length in np.unique(lengths).tolist():
        which = np.flatnonzero(lengths == length)
        starts = offsets[texts[which]]
        acc = token_ids[starts].copy()
        with np.errstate(over="ignore"):
            for j in range(1, length):
                acc = acc * _MULT + token_ids[starts + j]
        out[which] = acc
    return out


def rolling_gram_hashes(token_ids: np.ndarray, lengths: list[int]):
    """One rolling pass over a concatenation of texts for several gram lengths: yields
    (length, hashes) where hashes[p] is the gram starting at token p (an L-gram hash is the
    (L-1)-gram hash times the multiplier plus the next token). Grams that cross a text boundary
    are included: the caller checks boundaries only for the few grams it keeps."""
    wanted = set(lengths)
    acc = token_ids.copy()
    with np.errstate(over="ignore"):
        for length in range(1, max(wanted, default=0) + 1):
            if length > 1:
                acc = acc[:-1] * _MULT + token_ids[length - 1 :]
            if length in wanted and len(acc):
                yield length, acc


def fold32(hashes: np.ndarray) -> np.ndarray:
    """64-bit gram hashes to the 32-bit inputs datasketch's affine32 MinHash expects."""
    return ((hashes ^ (hashes >> np.uint64(32))) & _MASK32).astype(np.uint32)


def distinct(values: np.ndarray) -> np.ndarray:
    """The sorted distinct values: np.unique by one sort. numpy 2.4's np.unique of integers
    takes a hash-table path that is 50-100x slower than sorting on arrays of a million values."""
    if not len(values):
        return np.sort(values)
    ordered = np.sort(values)
    first = np.empty(len(ordered), bool)
    first[0] = True
    np.not_equal(ordered[1:], ordered[:-1], out=first[1:])
    return ordered[first]


def sorted_member(values: np.ndarray, sorted_keys: np.ndarray) -> np.ndarray:
    """np.isin for a sorted key array, by binary search (no sort of `values`)."""
    if not len(sorted_keys):
        return np.zeros(values.shape, dtype=bool)
    pos = np.searchsorted(sorted_keys, values)
    np.minimum(pos, len(sorted_keys) - 1, out=pos)
    return sorted_keys[pos] == values
