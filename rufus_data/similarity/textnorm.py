"""The one text normalisation that decontam, dedup and the embedder share (the hashes of its
words and n-grams are in ngram_hash.py).

Rules (both sides of every comparison go through the same function):
- Unicode NFKC, then lowercase, so full-width digits, ligatures and case compare equal;
- sentence punctuation is dropped: ``; : ! ? " ' ` ( ) [ ]``, typographic quotes and dashes,
  and ``.`` / ``,`` unless a digit follows (``3.5`` and ``1,000`` stay as they are);
- whitespace of any kind and length separates words;
- numbers and LaTeX are kept as they are (``\\frac{1}{2}``, ``x^2+1``, ``<<48/2=24>>`` are each one
  word): collapsing digits would make every math problem collide.

It runs as Arrow compute kernels (RE2) over a whole batch of texts at once."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

_SENTENCE_PUNCT = "[;:!?\"'`()\\[\\]\\x{2018}\\x{2019}\\x{201a}\\x{201c}\\x{201d}\\x{201e}\\x{2013}\\x{2014}\\x{2015}\\x{2026}\\x{ab}\\x{bb}\\x{bf}\\x{a1}]"
_SEPARATOR_NOT_IN_NUMBER = r"[.,]+(\D|$)"


def normalise_array(texts: pa.Array) -> pa.Array:
    """The normalised text of each element (see the module docstring), words split by whitespace."""
    texts = pc.utf8_lower(pc.utf8_normalize(texts, "NFKC"))
    texts = pc.replace_substring_regex(texts, _SEPARATOR_NOT_IN_NUMBER, r" \1")
    return pc.replace_substring_regex(texts, _SENTENCE_PUNCT, " ")


def tokenize_array(texts: pa.Array) -> tuple[pa.Array, np.ndarray]:
    """All words of all texts as one flat string array, and each text's start offset (len + 1)."""
    return _flat_words(_split_unicode_whitespace(normalise_array(texts)))


def _split_unicode_whitespace(texts: pa.Array) -> pa.Array:
    """`pc.utf8_split_whitespace`, with one word appended and dropped again: pyarrow 26's kernel reads
    past the end of the data, and when the last text ends in whitespace it now and then (1 call in
    80, by the bytes after the buffer) keeps that whitespace in the last word. The ASCII split
    and whitespace inside the data are unaffected."""
    padded = pa.concat_arrays([texts, pa.array(["x"], texts.type)])
    return pc.utf8_split_whitespace(padded).slice(0, len(texts))


# ASCII control characters that the Unicode split takes for whitespace and the ASCII split does not
_CONTROL_SEPARATORS = "\\x1c-\\x1f"
_SENTENCE_PUNCT_OR_SEPARATOR = _SENTENCE_PUNCT[:-1] + _CONTROL_SEPARATORS + "]"


def tokenize_unordered(texts: pa.Array) -> tuple[pa.Array, np.ndarray, np.ndarray]:
    """The words of `tokenize_array`, with the texts in an order of its own: ASCII texts first,
    for which NFKC changes nothing and the ASCII kernels are about twice as fast. Returns the
    words, each output text's start offset, and `order`: output text i is input text order[i].
    For callers that group words by something other than the texts' order (dedup's row sets)."""
    is_ascii = pc.fill_null(pc.string_is_ascii(texts), False).to_numpy(zero_copy_only=False)
    plain, other = np.flatnonzero(is_ascii), np.flatnonzero(~is_ascii)
    lists = []
    if len(plain):
        ascii_texts = pc.ascii_lower(texts if not len(other) else texts.take(pa.array(plain)))
        ascii_texts = pc.replace_substring_regex(ascii_texts, _SEPARATOR_NOT_IN_NUMBER, r" \1")
        ascii_texts = pc.replace_substring_regex(ascii_texts, _SENTENCE_PUNCT_OR_SEPARATOR, " ")
        lists.append(pc.ascii_split_whitespace(ascii_texts))
    if len(other) or not len(plain):
        lists.append(_split_unicode_whitespace(normalise_array(texts if not len(plain) else texts.take(pa.array(other)))))
    flat, offsets = _flat_words(pa.concat_arrays(lists) if len(lists) > 1 else lists[0])
    return flat, offsets, np.concatenate((plain, other))


def _flat_words(lists: pa.Array) -> tuple[pa.Array, np.ndarray]:
    """The words of split texts, flat, and each text's start offset (without the "" a split keeps)."""
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
