"""Stage 1 of dedup, a batch of rows at a time: each row's shingle set (all its text fields,
normalised as decontam normalises them, shingled apart), its MinHash signature by decontam's
`BatchMinHasher` (bit-identical to datasketch's `MinHash.bulk`) and its LSH band keys, written
out by partition for the grouping stage (rufus_data/dedup/shuffle.py); beside them a hash of
each row's whole shingle set (exact copies share one) and of its `origin_id` (a mix's repeats
share one), and, for the share report, each source's train tokens. Nothing of a row stays in
memory after its batch."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from rufus_data.base.engines import RowGroupTask, TaskWorker
from rufus_data.dedup.config import LSH_WEIGHTS, DedupConfig
from rufus_data.dedup.report import source_tokens
from rufus_data.dedup.shuffle import KEYED, key_partition, partitioned_file
from rufus_data.dedup.work import save_arrays
from rufus_data.folders.shards import ORIGIN_COLUMN
from rufus_data.similarity.minhash_lsh import BatchMinHasher, band_keys, band_params
from rufus_data.similarity.ngram_hash import (
    TokenHasher,
    batch_gram_hashes,
    distinct,
    fold32,
    whole_text_hashes,
)
from rufus_data.similarity.text_fields import text_arrays
from rufus_data.similarity.textnorm import tokenize_unordered

_LOW32 = np.uint64(0xFFFFFFFF)
KEY_KINDS = ("bands", "sets", "origins", "fields")
NUMBER_WORD = "^[^a-z]*[0-9]"  # a word whose first letter or digit is a digit: 12, $5, <<48/2=24>>24, 3rd (not x2)
CONTEXT_WORDS = 2  # a number's context: this many words on each side, in its own field


@dataclass
class RowShingles:
    """The shingle sets of a batch of rows: row i's sorted distinct shingles are
    shingles[offsets[i]:offsets[i + 1]] (empty for a row without words)."""

    shingles: np.ndarray  # uint32
    offsets: np.ndarray  # int64, rows + 1

    def sizes(self) -> np.ndarray:
        return np.diff(self.offsets)

    def set_hashes(self, rows: np.ndarray) -> np.ndarray:
        """A 64-bit hash of each of these (non-empty) rows' whole set of shingles (each shingle as
        many times as it is held): rows with the same shingles, the same hash."""
        sums = np.add.reduceat(_mix64(self.shingles.astype(np.uint64)), self.offsets[rows]) if len(rows) else np.empty(0, np.uint64)
        return _mix64(sums ^ self.sizes()[rows].astype(np.uint64))


def _mix64(x: np.ndarray) -> np.ndarray:
    """A 64-bit finaliser (splitmix64's): every input bit moves every output bit."""
    with np.errstate(over="ignore"):
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


@dataclass
class RowWords:
    """The words of a batch of rows' text fields, normalised: field f's token hashes are
    ids[offsets[f]:offsets[f + 1]], it belongs to row row_of[f], and system[f] says whether it is
    a system message."""

    words: pa.Array
    ids: np.ndarray
    offsets: np.ndarray
    row_of: np.ndarray
    system: np.ndarray

    def field_keys(self) -> np.ndarray:
        """A 64-bit hash of each field's whole word sequence: fields with the same words, the same key."""
        lengths = np.diff(self.offsets)
        owner = np.repeat(np.arange(len(lengths)), lengths)
        with np.errstate(over="ignore"):
            place = (np.arange(len(self.ids)) - self.offsets[owner]).astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)
            mixed = _mix64(self.ids ^ place)
        sums = np.zeros(len(lengths), np.uint64)
        filled = lengths > 0
        if filled.any():
            sums[filled] = np.add.reduceat(mixed, self.offsets[:-1][filled])
        return _mix64(sums ^ lengths.astype(np.uint64))


@dataclass
class NumberContexts:
    """Every number of a batch of rows that has CONTEXT_WORDS words on each side in its field:
    its row, the hash of those words (numbers among them masked: a context is the same whatever
    numbers fill it), and the hash of that context with the number in it."""

    rows: np.ndarray  # int64
    contexts: np.ndarray  # uint64
    numbers: np.ndarray  # uint64


_NUMBER_MASK = np.uint64(0x6A09E667F3BCC909)  # the id every number word takes inside a context


def number_contexts(words: RowWords) -> NumberContexts:
    """The numbers of these words in their contexts (NumberContexts). A number within CONTEXT_WORDS
    of its field's start or end has no context: it is the field's frame ("Problem 12: ...", "... [id 7]");
    nor has a number of a system message (which says how to answer, not what: "conversation 4521 of the log")."""
    k = CONTEXT_WORDS
    if not len(words.ids):
        return NumberContexts(np.empty(0, np.int64), np.empty(0, np.uint64), np.empty(0, np.uint64))
    is_number = pc.match_substring_regex(words.words, NUMBER_WORD).to_numpy(zero_copy_only=False)
    field = np.repeat(np.arange(len(words.offsets) - 1), np.diff(words.offsets))
    at = np.flatnonzero(is_number)
    at = at[(at - words.offsets[field[at]] >= k) & (words.offsets[field[at] + 1] - at > k) & ~words.system[field[at]]]
    masked = np.where(is_number, _NUMBER_MASK, words.ids)
    context = np.full(len(at), np.uint64(k))
    with np.errstate(over="ignore"):
        for shift in (*range(-k, 0), *range(1, k + 1)):
            context = _mix64(context * np.uint64(0x9E3779B97F4A7C15) + masked[at + shift])
        numbers = _mix64(context ^ (words.ids[at] * np.uint64(0xBF58476D1CE4E5B9)))
    return NumberContexts(words.row_of[field[at]], context, numbers)


def row_words(table: pa.Table, hasher: TokenHasher) -> RowWords:
    texts, row_of, system = text_arrays(table, system_flags=True)
    if not len(texts):
        return RowWords(pa.array([], pa.large_string()), np.empty(0, np.uint64), np.zeros(1, np.int64), row_of, system)
    words, offsets, order = tokenize_unordered(texts)  # the texts' order does not matter: rows are regrouped
    return RowWords(words, hasher(words), offsets, row_of[order], system[order])


def field_shingles(words: RowWords, shingle: int) -> tuple[np.ndarray, np.ndarray]:
    """(32-bit shingle, field of each): a field shorter than a shingle is one shingle of all its words."""
    grams, field = batch_gram_hashes(words.ids, words.offsets, shingle)
    lengths = np.diff(words.offsets)
    short = np.flatnonzero((lengths > 0) & (lengths < shingle))
    return fold32(np.concatenate((grams, whole_text_hashes(words.ids, words.offsets, short)))), np.concatenate((field, short))


def per_row(rows: np.ndarray, values: np.ndarray, n_rows: int, sets: bool = True) -> RowShingles:
    """Values (uint32) grouped by row: with `sets`, each row's sorted distinct values."""
    if sets:  # one sort gives every row's distinct values, row by row
        tagged = distinct((rows.astype(np.uint64) << np.uint64(32)) | values.astype(np.uint64))
        rows, values = (tagged >> np.uint64(32)).astype(np.int64), (tagged & _LOW32).astype(np.uint32)
    else:  # grouped by row: a few sorted runs (one per text column, and the short fields), merged
        order = np.argsort(rows, kind="stable")
        rows, values = rows[order], values[order]
    return RowShingles(values, np.searchsorted(rows, np.arange(n_rows + 1)).astype(np.int64))


def row_shingles(table: pa.Table, shingle: int, hasher: TokenHasher, sets: bool = True) -> RowShingles:
    """Every row's set of `shingle`-word shingles (32-bit, MinHash's input), over all its text
    fields; a field shorter than a shingle is one shingle of all its words. `sets=False` keeps a
    shingle that a row holds twice twice: its MinHash is the same, and it saves a sort."""
    words = row_words(table, hasher)
    shingles, field = field_shingles(words, shingle)
    return per_row(words.row_of[field], shingles, table.num_rows, sets)


@dataclass(frozen=True)
class SketchPlan:
    """What every sketch task needs to know besides its rows."""

    folder: Path  # the work folder
    parts: dict[str, int]  # partitions of each kind of key
    train_paths: frozenset[str]  # the shards of the train split (their tokens make the share report)
    token_column: str  # the column a mix's shares count


def sketch_file(folder: Path, task: RowGroupTask, kind: str) -> Path:
    """A task's file of one kind of key (KEY_KINDS), or its `meta`, written last: the task is done."""
    return Path(folder) / "sketch" / f"{task.first_row:012d}.{kind}.{'npz' if kind == 'meta' else 'arrow'}"


class SketchWorker(TaskWorker):
    """Stage 1 over one row group: band keys and origin keys out by partition, and the meta."""

    def __init__(self, config: DedupConfig, plan: SketchPlan):
        self.config, self.plan = config, plan
        self.b, self.r = band_params(config.band_threshold, config.num_perm, LSH_WEIGHTS)

    def setup(self, one_cpu: bool) -> None:
        super().setup(one_cpu)
        self.hasher = TokenHasher()
        self.minhasher = BatchMinHasher(self.config.num_perm, self.config.seed)

    def __call__(self, task: RowGroupTask) -> int:
        plan = self.plan
        has_words: list[np.ndarray] = []
        tokens: dict[str, int] = {}
        counted = task.path in plan.train_paths
        column_seen = False  # whether these train rows carry the token column (else rows are counted)
        with contextlib.ExitStack() as files:
            add = {kind: files.enter_context(partitioned_file(sketch_file(plan.folder, task, kind), KEYED, plan.parts[kind]))
                   for kind in KEY_KINDS}

            def out(kind: str, keys: np.ndarray, rows: np.ndarray) -> None:
                add[kind](key_partition(keys, plan.parts[kind]), key=keys, row=rows)

            for first, table in task.batches():
                words = row_words(table, self.hasher)
                shingles, field = field_shingles(words, self.config.shingle)
                sets = per_row(words.row_of[field], shingles, table.num_rows, sets=False)
                has = sets.sizes() > 0
                has_words.append(has)
                filled = np.flatnonzero(has)
                sigs = self.minhasher.segments(sets.shingles, sets.offsets[filled])
                out("bands", band_keys(sigs, self.b, self.r).ravel(), np.repeat(first + filled, self.b))
                out("sets", sets.set_hashes(filled), first + filled)
                fields = np.flatnonzero(np.diff(words.offsets) >= self.config.scaffold_min_words)
                out("fields", words.field_keys()[fields], first + words.row_of[fields])
                rows, origin_keys = self._origins(table)
                out("origins", origin_keys, first + rows)
                if counted:
                    column_seen |= plan.token_column in table.column_names
                    for source, count in source_tokens(table, plan.token_column).items():
                        tokens[source] = tokens.get(source, 0) + count
        save_arrays(sketch_file(plan.folder, task, "meta"), has_words=np.concatenate(has_words) if has_words else np.zeros(0, bool),
                    sources=np.asarray(list(tokens), dtype=str), tokens=np.asarray(list(tokens.values()), dtype=np.int64),
                    column_seen=np.asarray(column_seen))
        return task.rows

    def _origins(self, table: pa.Table) -> tuple[np.ndarray, np.ndarray]:
        """(row in the batch, hash of its origin_id) of the rows that have one."""
        if ORIGIN_COLUMN not in table.column_names:
            return np.empty(0, np.int64), np.empty(0, np.uint64)
        column = pc.cast(table.column(ORIGIN_COLUMN), pa.large_string())
        rows = np.flatnonzero(column.is_valid().to_numpy(zero_copy_only=False))
        return rows, self.hasher(column.drop_null().combine_chunks() if rows.size else pa.array([], pa.large_string()))

