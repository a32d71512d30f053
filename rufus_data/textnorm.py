"""The one text normalisation that decontam and dedup share, and the word n-gram hashes built on it.

Rules (both sides of every comparison go through the same function):
- Unicode NFKC, then lowercase, so full-width digits, ligatures and case compare equal;
- sentence punctuation is dropped: ``; : ! ? " ' ` ( ) [ ]``, typographic quotes and dashes,
  and ``.`` / ``,`` unless a digit follows (``3.5`` and ``1,000`` stay as they are);
- whitespace of any kind and length separates words;
- numbers and LaTeX are kept as they are (``\\frac{1}{2}``, ``x^2+1``, ``<<48/2=24>>`` are each one
  word): collapsing digits would make every math problem collide.

It runs as Arrow compute kernels (RE2) over a whole batch of texts at once; tokens are hashed
with polars' seeded vectorised string hash, and an n-gram is a polynomial rolling hash of its token hashes, computed in numpy."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

_SENTENCE_PUNCT = "[;:!?\"'`()\\[\\]\\x{2018}\\x{2019}\\x{201a}\\x{201c}\\x{201d}\\x{201e}\\x{2013}\\x{2014}\\x{2015}\\x{2026}\\x{ab}\\x{bb}\\x{bf}\\x{a1}]"
_SEPARATOR_NOT_IN_NUMBER = r"[.,]+(\D|$)"

_MULT = np.uint64(0x9E3779B97F4A7C15)  # odd 64-bit multiplier of the rolling n-gram hash
_MASK32 = np.uint64(0xFFFFFFFF)


def normalize_array(texts: pa.Array) -> pa.Array:
    """The normalised text of each element (see the module docstring), words split by whitespace."""
    texts = pc.utf8_lower(pc.utf8_normalize(texts, "NFKC"))
    texts = pc.replace_substring_regex(texts, _SEPARATOR_NOT_IN_NUMBER, r" \1")
    return pc.replace_substring_regex(texts, _SENTENCE_PUNCT, " ")


def tokenize_array(texts: pa.Array) -> tuple[pa.Array, np.ndarray]:
    """All words of all texts as one flat string array, and each text's start offset (len + 1)."""
    lists = pc.utf8_split_whitespace(normalize_array(texts))
    flat = pc.list_flatten(lists)
    offsets = lists.offsets.to_numpy().astype(np.int64)
    offsets -= offsets[0]
    if len(flat) and pc.any(pc.equal(flat, "")).as_py():  # the split keeps "" where a text ends in a space
        keep = pc.not_equal(flat, "").to_numpy(zero_copy_only=False)
        owner = np.repeat(np.arange(len(offsets) - 1), np.diff(offsets))
        counts = np.bincount(owner[keep], minlength=len(offsets) - 1)
        flat = flat.filter(pa.array(keep))
        offsets = np.concatenate(([0], np.cumsum(counts))).astype(np.int64)
    return flat, offsets


def words(text: str) -> list[str]:
    """The normalised words of one text (the same rules as for a batch)."""
    flat, _ = tokenize_array(pa.array([text or ""], pa.large_string()))
    return flat.to_pylist()


class TokenHasher:
    """64-bit ids for tokens: polars' vectorised string hash with fixed seeds, so the same token
    gets the same id in every process of a run (workers, Ray tasks) that uses the same polars
    version; the eval index and the scan are always built within one run."""

    SEED = 0x5EED

    def __call__(self, tokens) -> np.ndarray:
        import polars as pl

        if not isinstance(tokens, (pa.Array, pa.ChunkedArray)):
            tokens = pa.array(tokens, pa.large_string())
        if not len(tokens):
            return np.empty(0, dtype=np.uint64)
        return pl.from_arrow(tokens).hash(self.SEED).to_numpy().astype(np.uint64, copy=False)


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


def shingle32(token_ids: np.ndarray, k: int) -> np.ndarray:
    """The distinct k-word shingles of one text as 32-bit ints (MinHash input); a text shorter
    than k words is one shingle of all its words."""
    grams = gram_hashes(token_ids, k) if len(token_ids) >= k else gram_hashes(token_ids, len(token_ids))
    return np.unique(fold32(grams))
