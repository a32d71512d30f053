"""Stage 1 of decontam, exact word n-grams: the n-grams (n=8) of every eval problem and of every
distinctive answer are indexed once; every text field of a training row is looked up in
numpy batches. An eval text shorter than n words is one whole-text gram; an answer shorter than
`min_answer_words` is kept aside and only counts next to its own problem (scan.py).
n-grams shared by many eval item families are boilerplate and never indexed."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pyarrow.compute as pc

from rufus_data.decontam.candidates import Candidates
from rufus_data.decontam.config import DecontamConfig
from rufus_data.decontam.texts import PROBLEM, EvalTexts, FieldBatch
from rufus_data.similarity.ngram_hash import gram_hashes, rolling_gram_hashes, sorted_member

FILTER_BITS = 22


@dataclass
class Postings:
    """gram -> eval items, in numpy arrays (pickles in milliseconds, unlike a dict of lists)."""

    keys: np.ndarray  # sorted distinct gram hashes
    starts: np.ndarray  # keys[i]'s entries are items[starts[i]:starts[i+1]]
    items: np.ndarray
    is_answer: np.ndarray
    places: np.ndarray  # where the gram is in its item: its first word's index among all eval words

    def __len__(self) -> int:
        return len(self.keys)

    def lookup_many(self, grams: np.ndarray) -> list[list[tuple[int, bool, int]]]:
        """(item, is answer, place) of each gram's entries (all of them must be keys)."""
        where = np.searchsorted(self.keys, grams)
        starts, stops = self.starts[where].tolist(), self.starts[where + 1].tolist()
        return [list(zip(self.items[a:b].tolist(), self.is_answer[a:b].tolist(), self.places[a:b].tolist()))
                for a, b in zip(starts, stops)]


@dataclass
class ExactIndex:
    """The eval side of the exact stage."""

    gram_lengths: list[int]  # n, plus the lengths of short whole-text grams, longest first
    keys: dict[int, np.ndarray]  # length -> sorted gram hashes
    # length -> (bool filter, mask): True where some key's low bits point; a cheap first filter,
    # one per length (the few short whole-text grams get a small, sparse one)
    filters: dict[int, tuple[np.ndarray, np.uint64]]
    postings: Postings  # gram hash -> (item index, problem or answer), as flat numpy arrays
    item_grams: np.ndarray  # per item: distinct problem grams (containment denominator)
    item_words: np.ndarray  # per item: the words of its problems
    answer_grams: np.ndarray  # per item: distinct indexed answer grams
    short_answers: dict[int, list[np.ndarray]]  # item -> token ids of short answers
    boilerplate_grams: int = 0  # grams left out for being in too many eval item families


def build_exact_index(texts: EvalTexts, config: DecontamConfig) -> ExactIndex:
    """Vectorised over all eval texts at once: every problem's n-grams (a text shorter than n
    words is one gram of all its words), every answer's from `min_answer_words` words on (only
    grams with at least 3 words of letters; problems: grams with a word that holds a letter, since
    digits alone, `1 2 3 4 5 6 7 8` of a docstring's example, are in any list of numbers), each
    text's grams distinct."""
    n = config.ngram
    lengths = np.diff(texts.offsets)
    is_answer = np.asarray([kind != PROBLEM for _, kind in texts.owners], dtype=bool)
    item_of = np.asarray([i for i, _ in texts.owners], dtype=np.int64)
    indexed = (lengths > 0) & (~is_answer | (lengths >= config.min_answer_words))
    short_answers: dict[int, list[np.ndarray]] = {}
    for t in np.flatnonzero((lengths > 0) & ~indexed).tolist():
        short_answers.setdefault(int(item_of[t]), []).append(texts.text_ids(t))
    # full n-grams: one rolling hash over the concatenation, kept where the gram stays in its text
    text_of = np.repeat(np.arange(len(lengths)), lengths)
    grams = gram_hashes(texts.ids, n)
    start = np.arange(len(grams))
    owner = text_of[start]
    keep = indexed[owner] & (start + n <= texts.offsets[1:][owner])
    alpha = (pc.utf8_is_alpha(pc.utf8_slice_codeunits(texts.tokens, 0, 1)).to_numpy(zero_copy_only=False)
             if len(texts.tokens) else np.zeros(0, bool))
    letters = np.concatenate(([0], np.cumsum(alpha, dtype=np.int64)))  # answers: only grams with >= 3 words of letters
    keep &= ~is_answer[owner] | (letters[start + n] - letters[start] >= 3)
    lettered = np.concatenate(([0], np.cumsum(_holds_letter(texts.tokens), dtype=np.int64)))
    keep &= is_answer[owner] | (lettered[start + n] - lettered[start] >= 1)  # problems: a gram of digits is no evidence
    gram_text, grams, places = owner[keep], grams[keep], start[keep]
    # texts shorter than n words: one gram of all their words
    short = np.flatnonzero(indexed & (lengths < n) & (lettered[texts.offsets[1:]] > lettered[texts.offsets[:-1]]))
    short_grams = np.asarray([gram_hashes(texts.text_ids(t), int(lengths[t]))[0] for t in short.tolist()], dtype=np.uint64)
    gram_text = np.concatenate((gram_text, short))
    grams = np.concatenate((grams, short_grams))
    places = np.concatenate((places, texts.offsets[short]))
    gram_length = np.where(lengths[gram_text] < n, lengths[gram_text], n)
    # each text's grams distinct (the first place of each)
    order = np.lexsort((places, grams, gram_text))
    gram_text, grams, gram_length, places = gram_text[order], grams[order], gram_length[order], places[order]
    first = np.ones(len(grams), dtype=bool)
    first[1:] = (grams[1:] != grams[:-1]) | (gram_text[1:] != gram_text[:-1])
    gram_text, grams, gram_length, places = gram_text[first], grams[first], gram_length[first], places[first]
    per_text = np.bincount(gram_text, minlength=len(lengths))
    item_grams = np.bincount(item_of, weights=per_text * ~is_answer, minlength=len(texts.items)).astype(np.int64)
    answer_grams = np.bincount(item_of, weights=per_text * is_answer, minlength=len(texts.items)).astype(np.int64)
    item_words = np.bincount(item_of, weights=lengths * ~is_answer, minlength=len(texts.items)).astype(np.int64)
    postings, key_arrays, n_boiler = gram_postings(grams, item_of[gram_text], is_answer[gram_text], gram_length,
                                                    places, config.max_items_per_gram, texts.family)
    filters = {length: low_bits_filter(keys) for length, keys in key_arrays.items()}
    return ExactIndex(sorted(key_arrays, reverse=True), key_arrays, filters, postings, item_grams, item_words,
                      answer_grams, short_answers, n_boiler)


def _holds_letter(tokens) -> np.ndarray:
    """Whether each word holds a letter of any script (`x2`, `\\frac`, `f(1` do; `12`, `3.5`, `+` do not)."""
    return pc.match_substring_regex(tokens, r"\pL").to_numpy(zero_copy_only=False) if len(tokens) else np.zeros(0, bool)


def low_bits_filter(keys: np.ndarray) -> tuple[np.ndarray, np.uint64]:
    """A bool array over the keys' low bits, about 64 slots a key (2^12 to 2^22 slots): with one
    filter for all lengths, the 8-grams' keys made every short length's filter pass 1 gram in 20."""
    bits = int(np.clip(np.ceil(np.log2(max(1, len(keys)) * 64)), 12, FILTER_BITS))
    mask = np.uint64((1 << bits) - 1)
    filter_ = np.zeros(1 << bits, dtype=bool)
    filter_[(keys & mask).astype(np.int64)] = True
    return filter_, mask


def gram_postings(grams: np.ndarray, items: np.ndarray, is_answer: np.ndarray, lengths: np.ndarray, places: np.ndarray,
                   max_items: int, item_family: np.ndarray) -> tuple[Postings, dict[int, np.ndarray], int]:
    """Vectorised: one entry per (gram, item), problem before answer; grams in more than
    `max_items` distinct eval item families (`item_family[item]`: perturbations of one seed
    question are one family, other items their own) are boilerplate and left out. Returns the
    postings, the sorted keys per gram length, and how many grams were boilerplate."""
    if not len(grams):
        empty = np.empty(0, np.uint64)
        return Postings(empty, np.zeros(1, np.int64), np.empty(0, np.int64), np.empty(0, bool), np.empty(0, np.int64)), {}, 0
    order = np.lexsort((places, is_answer, items, grams))
    grams, items, is_answer, lengths, places = grams[order], items[order], is_answer[order], lengths[order], places[order]
    first = np.ones(len(grams), dtype=bool)
    first[1:] = (grams[1:] != grams[:-1]) | (items[1:] != items[:-1])
    grams, items, is_answer, lengths, places = grams[first], items[first], is_answer[first], lengths[first], places[first]
    starts = np.flatnonzero(np.concatenate(([True], grams[1:] != grams[:-1])))
    per_gram = np.diff(np.append(starts, len(grams)))
    # distinct families per gram: sort by (gram, family); gram segments keep their places
    families = item_family[items]
    by_family = np.lexsort((families, grams))
    g, f = grams[by_family], families[by_family]
    new_family = np.ones(len(g), dtype=np.int64)
    new_family[1:] = (g[1:] != g[:-1]) | (f[1:] != f[:-1])
    keep_gram = np.add.reduceat(new_family, starts) <= max_items
    keep = np.repeat(keep_gram, per_gram)
    keys = grams[starts][keep_gram]
    key_lengths = lengths[starts][keep_gram]
    kept_counts = per_gram[keep_gram]
    offsets = np.zeros(len(keys) + 1, dtype=np.int64)
    np.cumsum(kept_counts, out=offsets[1:])
    postings = Postings(keys, offsets, items[keep], is_answer[keep], places[keep])
    by_length = {int(n): keys[key_lengths == n] for n in np.unique(key_lengths)}
    return postings, by_length, int((~keep_gram).sum())


def indexed_grams(ids: np.ndarray, offsets: np.ndarray, index) -> Iterator[tuple[int, np.ndarray, np.ndarray, np.ndarray]]:
    """(length, grams, starts, texts) of the grams of each indexed length that are in the index
    (`gram_lengths`, `filters`, `keys`): a filter on the low bits discards almost every gram, a
    binary search checks the rest; a gram that crosses into the next text is none."""
    for length, grams in rolling_gram_hashes(ids, index.gram_lengths):
        filter_, mask = index.filters[length]
        maybe = np.flatnonzero(filter_[(grams & mask).astype(np.int64)])
        if not len(maybe):
            continue
        hit = maybe[sorted_member(grams[maybe], index.keys[length])]
        owner = np.searchsorted(offsets, hit, side="right") - 1
        inside = hit + length <= offsets[owner + 1]
        yield length, grams, hit[inside], owner[inside]


def scan_exact(batch: FieldBatch, index: ExactIndex, found: Candidates) -> None:
    """Exact n-grams (and short whole-text grams), vectorised over the batch: one rolling pass
    for all gram lengths, a filter on the low bits to discard almost every gram, a binary
    search for the rest."""
    for length, grams, hit, owner in indexed_grams(batch.ids, batch.offsets, index):
        for start, t, entries in zip(hit.tolist(), owner.tolist(), index.postings.lookup_many(grams[hit])):
            gram = int(grams[start])
            text = " ".join(batch.tokens[start : start + length].to_pylist())
            for item, is_answer, place in entries:
                c = found.at(int(batch.row_of[t]), item)
                c.fields.add(batch.names[t])
                if is_answer:
                    c.answer_grams[gram] = text
                else:
                    c.problem_grams[gram] = text
                    c.problem_places[gram] = (place, length)
