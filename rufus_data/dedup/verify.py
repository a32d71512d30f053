"""Stage 3 of dedup, verification: every candidate pair counts only if its measure reaches the
threshold (DedupConfig.measure; docs/decontam.md, "Which rows are duplicates"):

    containment  the share of a row's own shingles found in the other row, for the row of the
                 pair with fewer own shingles: a row under a new preamble, suffix, system prompt
                 or ID is contained in its copy. Each of that row's own fields must be found
                 at `field_containment` too, or the value is that field's: the same setup asking
                 another question, with another answer, keeps most shingles but not its answer. A row's own shingles are those of its fields
                 that are not scaffold (a whole message held by many rows: a shared system
                 prompt); rows with fewer than `min_own_shingles` of them are compared by the
                 Jaccard of those.
    jaccard      the exact Jaccard similarity of the two rows' shingle sets.

and, with `numbers_must_match`, the rows agree on the numbers of the content they share: a number
has a context, the words around it (signatures.number_contexts), and wherever both rows have
numbers in one context, the numbers of one row there must be among the other's there (one row
may lack a number the other has, but not have another in its place). The same template with other numbers is another
problem; a number of a row's own frame (an id, a "Problem 12:", a list number at a message's
edge or among words the other row lacks, a counter in a system prompt) tells nothing apart.

No row's shingles are held for the run: first the rows that are in some candidate pair (a
small share of the rows, unless the data is mostly duplicates) are read again and shingled,
row group by row group, into spill files (`ShingleWorker`: shingles flagged own or scaffold, and
the numbers in their contexts); then each partition of the pairs is verified in chunks of a bounded number of
shingles, reading just the rows each chunk needs (`VerifyWorker`)."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa

from rufus_data.base.engines import RowGroupTask, TaskWorker
from rufus_data.dedup.config import DedupConfig
from rufus_data.dedup.shuffle import PAIRS, read_partition
from rufus_data.dedup.signatures import field_shingles, number_contexts, per_row, row_words
from rufus_data.dedup.work import batch_file, load_arrays, save_arrays, write_atomic
from rufus_data.similarity.ngram_hash import TokenHasher, distinct, fold32, sorted_member

EDGES = pa.schema([("a", pa.int64()), ("b", pa.int64()), ("value", pa.float64()), ("jaccard", pa.float64())])
CHUNK_SHINGLES = 2_000_000  # shingles of both rows of the pairs verified at once (8 bytes each, sorted)
COALESCE_BYTES = 1 << 16  # reads of one spill file closer than this are made as one
# what the spill holds of each row: its shingles; the context of each number that has one, and that
# context with its number (aligned)
STREAMS = ("shingles", "contexts", "numbers")
FIELD_SLOTS = 16  # fields of a row told apart by the per-field rule (later ones share the last slot)
_TAG_BITS = 5  # a spilled shingle's low bits: whether its field is the row's own, and the field's slot
_TAG = np.uint32(_TAG_BITS)


def shingle_files(folder: Path, first_row: int) -> tuple[Path, Path]:
    """(the shingles, the index: rows and offsets) of the candidate rows of the task starting at
    `first_row`; the numbers are beside the shingles; the index is written last."""
    base = Path(folder) / "shingles" / f"{first_row:012d}"
    return base.with_suffix(".bin"), base.with_suffix(".index.npz")


def _stream_file(folder: Path, first_row: int, stream: str) -> Path:
    data = shingle_files(folder, first_row)[0]
    return data if stream == "shingles" else data.with_suffix(f".{stream}.bin")


def _field_slots(row_of: np.ndarray) -> np.ndarray:
    """Each field's place among its row's fields (0, 1, ...; at most FIELD_SLOTS - 1)."""
    order = np.lexsort((np.arange(len(row_of)), row_of))
    first = np.searchsorted(row_of[order], row_of[order])
    slots = np.empty(len(row_of), np.int64)
    slots[order] = np.arange(len(row_of)) - first
    return np.minimum(slots, FIELD_SLOTS - 1)


def row_evidence(table: pa.Table, shingle: int, hasher: TokenHasher, scaffold: np.ndarray):
    """The STREAMS of every row: its distinct shingles, each tagged in its low bits (`_TAG_BITS`)
    with the field it is in and whether that field is the row's own (not scaffold: `scaffold`,
    sorted field keys); its numbers in their contexts: each one's context, and the context with
    its number, aligned."""
    words = row_words(table, hasher)
    shingles, field = field_shingles(words, shingle)
    own = ~sorted_member(words.field_keys(), scaffold)
    tags = (own.astype(np.uint32) << np.uint32(_TAG_BITS - 1)) | _field_slots(words.row_of).astype(np.uint32)
    sets = per_row(words.row_of[field], ((shingles >> _TAG) << _TAG) | tags[field], table.num_rows)
    # a shingle in two fields is kept once: in an own field if it is in one (those sort last)
    row = np.repeat(np.arange(table.num_rows), sets.sizes())
    base = (row.astype(np.uint64) << np.uint64(32)) | (sets.shingles >> _TAG).astype(np.uint64)
    last = np.ones(len(base), bool)
    last[:-1] = base[1:] != base[:-1]
    shingles = per_row(row[last], sets.shingles[last], table.num_rows, sets=False)
    found = number_contexts(words)
    contexts, numbers = fold32(found.contexts), fold32(found.numbers)
    return (shingles, per_row(found.rows, contexts, table.num_rows, sets=False),
            per_row(found.rows, numbers, table.num_rows, sets=False))


class ShingleWorker(TaskWorker):
    """The shingle sets of one row group's candidate rows (`candidates`: a bool per row, saved
    by the parent), into the spill."""

    def __init__(self, config: DedupConfig, folder: Path, candidates: Path, scaffold: Path):
        self.config, self.folder, self.candidates, self.scaffold = config, folder, candidates, scaffold

    def setup(self, one_cpu: bool) -> None:
        super().setup(one_cpu)
        self.hasher = TokenHasher()

    def __call__(self, task: RowGroupTask) -> int:
        wanted = np.load(self.candidates, mmap_mode="r")
        scaffold = np.load(self.scaffold)
        index_path = shingle_files(self.folder, task.first_row)[1]
        found = [(first + local, self._evidence(table, local, scaffold)) for first, table in task.batches()
                 if len(local := np.flatnonzero(wanted[first : first + table.num_rows]))]
        offsets = {}
        for k, stream in enumerate(STREAMS):
            parts = [evidence[k] for _, evidence in found]

            def write(tmp: Path, parts=parts) -> None:
                with open(tmp, "wb") as fh:
                    fh.writelines(part.shingles.tobytes() for part in parts)

            write_atomic(_stream_file(self.folder, task.first_row, stream), write)
            sizes = np.concatenate([p.sizes() for p in parts]) if parts else np.empty(0, np.int64)
            offsets[stream] = np.concatenate(([0], np.cumsum(sizes))).astype(np.int64)
        rows = np.concatenate([r for r, _ in found]) if found else np.empty(0, np.int64)
        own = [np.add.reduceat(((e[0].shingles >> (_TAG - 1)) & 1).astype(np.int64), e[0].offsets[:-1]) * (e[0].sizes() > 0)
               for _, e in found if len(e[0].shingles)]
        save_arrays(index_path, rows=rows, own=np.concatenate(own) if own else np.empty(0, np.int64), **offsets)
        return task.rows

    def _evidence(self, table: pa.Table, local: np.ndarray, scaffold: np.ndarray):
        return row_evidence(table.take(pa.array(local)), self.config.shingle, self.hasher, scaffold)


class ShingleStore:
    """Reads the shingle sets (or numbers: `stream`) of given rows back from the spill of `ShingleWorker`."""

    def __init__(self, folder: Path, task_starts: np.ndarray):
        self.folder, self.task_starts = Path(folder), task_starts
        self._index: dict[int, dict[str, np.ndarray]] = {}

    def _task_index(self, task: int) -> dict[str, np.ndarray]:
        if task not in self._index:
            self._index[task] = load_arrays(shingle_files(self.folder, int(self.task_starts[task]))[1])
        return self._index[task]

    def _where(self, rows: np.ndarray, stream: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(task, start, end) in the spill of each of these rows."""
        tasks = np.searchsorted(self.task_starts, rows, side="right") - 1
        starts, ends = np.empty(len(rows), np.int64), np.empty(len(rows), np.int64)
        for task in distinct(tasks).tolist():
            at = np.flatnonzero(tasks == task)
            index = self._task_index(task)
            offsets = index[stream]
            pos = np.searchsorted(index["rows"], rows[at])
            starts[at], ends[at] = offsets[pos], offsets[pos + 1]
        return tasks, starts, ends

    def sizes(self, rows: np.ndarray, stream: str = "shingles") -> np.ndarray:
        _, starts, ends = self._where(rows, stream)
        return ends - starts

    def own_sizes(self, rows: np.ndarray) -> np.ndarray:
        """How many of each row's shingles are its own (not scaffold), from the index."""
        tasks = np.searchsorted(self.task_starts, rows, side="right") - 1
        out = np.empty(len(rows), np.int64)
        for task in distinct(tasks).tolist():
            at = np.flatnonzero(tasks == task)
            index = self._task_index(task)
            out[at] = index["own"][np.searchsorted(index["rows"], rows[at])]
        return out

    def load(self, rows: np.ndarray, stream: str = "shingles") -> tuple[np.ndarray, np.ndarray]:
        """The sets of `rows` (sorted, distinct): (values, offsets), row by row."""
        tasks, starts, ends = self._where(rows, stream)
        offsets = np.concatenate(([0], np.cumsum(ends - starts)))
        out = np.empty(int(offsets[-1]), np.uint32)
        for task in distinct(tasks).tolist():
            at = np.flatnonzero(tasks == task)
            with open(_stream_file(self.folder, int(self.task_starts[task]), stream), "rb") as fh:
                for lo, hi in _coalesced(starts[at], ends[at]):
                    fh.seek(4 * int(starts[at[lo]]))
                    span = np.frombuffer(fh.read(4 * int(ends[at[hi - 1]] - starts[at[lo]])), np.uint32)
                    run, sizes = at[lo:hi], ends[at[lo:hi]] - starts[at[lo:hi]]
                    out[_ranges(offsets[run], sizes)] = span[_ranges(starts[run] - starts[at[lo]], sizes)]
        return out, offsets


def _coalesced(starts: np.ndarray, ends: np.ndarray) -> list[tuple[int, int]]:
    """Runs [lo, hi) of rows (in file order) whose reads are close enough to make as one."""
    gaps = starts[1:] - ends[:-1]
    cuts = np.flatnonzero(gaps * 4 > COALESCE_BYTES) + 1
    bounds = np.concatenate(([0], cuts, [len(starts)])).tolist()
    return list(itertools.pairwise(bounds))


@dataclass(frozen=True)
class Scores:
    """Per pair: the measure's value, the Jaccard of the whole shingle sets, and whether each row
    holds the other's content numbers (the module docstring)."""

    value: np.ndarray
    jaccard: np.ndarray
    numbers_match: np.ndarray

    def duplicates(self, config: DedupConfig) -> np.ndarray:
        return (self.value >= config.threshold) & (self.numbers_match | (not config.numbers_must_match))


def scores(store: ShingleStore, a: np.ndarray, b: np.ndarray, config: DedupConfig) -> Scores:
    """Every pair's scores, in chunks of at most CHUNK_SHINGLES shingles."""
    out = [np.empty(len(a), np.float64), np.empty(len(a), np.float64), np.empty(len(a), bool)]
    if len(a):
        needed = distinct(np.concatenate((a, b)))
        size = store.sizes(needed)
        volume = size[np.searchsorted(needed, a)] + size[np.searchsorted(needed, b)]
        cuts = np.flatnonzero(np.diff(np.cumsum(volume) // CHUNK_SHINGLES)) + 1
        bounds = np.concatenate(([0], cuts, [len(a)])).tolist()
        for lo, hi in itertools.pairwise(bounds):
            for whole, part in zip(out, _chunk_scores(store, a[lo:hi], b[lo:hi], config)):
                whole[lo:hi] = part
    return Scores(*out)


def _side(values: np.ndarray, offsets: np.ndarray, rows: np.ndarray, at: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(pair of each value, value) of row rows[at[i]] for every pair i."""
    sizes = offsets[at + 1] - offsets[at]
    return np.repeat(np.arange(len(at), dtype=np.uint64), sizes), values[_ranges(offsets[at], sizes)]


def _found(x: tuple[np.ndarray, np.ndarray], y: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
    """Whether each value of the x side is among its pair's values on the y side (both sides come
    pair by pair, each row's values ascending: the keys are sorted already)."""
    return sorted_member((x[0] << np.uint64(32)) | x[1].astype(np.uint64), (y[0] << np.uint64(32)) | y[1].astype(np.uint64))


def _keyed(side: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
    """(pair << 32 | value) of every value of one side."""
    return (side[0] << np.uint64(32)) | side[1].astype(np.uint64)


def _numbers_agree(cx, nx, cy, ny, n: int) -> np.ndarray:
    """Per pair: whether, in every context where both rows have numbers, the numbers of one row
    there are among the other's there (a copy with a number left out agrees; a row with another
    number in its place does not: one row's numbers at that context are not the other's, and the
    other way round)."""
    def outside(c1, n1, c2, n2) -> np.ndarray:  # (pair, context) where side 1 has a number side 2 lacks there
        wrong = sorted_member(_keyed(c1), np.sort(_keyed(c2))) & ~sorted_member(_keyed(n1), np.sort(_keyed(n2)))
        return distinct(_keyed(c1)[wrong])

    x_side = outside(cx, nx, cy, ny)
    clash = x_side[sorted_member(x_side, outside(cy, ny, cx, nx))]
    agree = np.ones(n, bool)
    agree[(clash >> np.uint64(32)).astype(np.int64)] = False
    return agree


def _count(pairs: np.ndarray, n: int, where: np.ndarray | None = None) -> np.ndarray:
    return np.bincount((pairs if where is None else pairs[where]).astype(np.int64), minlength=n)


def _chunk_scores(store: ShingleStore, a: np.ndarray, b: np.ndarray, config: DedupConfig) -> tuple[np.ndarray, ...]:
    rows = distinct(np.concatenate((a, b)))
    ia, ib = np.searchsorted(rows, a), np.searchsorted(rows, b)
    n = len(a)
    tagged, offsets = store.load(rows)
    (pair_a, va), (pair_b, vb) = _side(tagged, offsets, rows, ia), _side(tagged, offsets, rows, ib)
    full_a, full_b = (pair_a, va >> _TAG), (pair_b, vb >> _TAG)
    size_a, size_b = _count(pair_a, n), _count(pair_b, n)
    a_in_b = _found(full_a, full_b)
    inter = _count(pair_a, n, a_in_b)
    jaccard = inter / (size_a + size_b - inter)  # rows in pairs have words: never 0 / 0
    (ca, na), (cb, nb) = ([_side(*store.load(rows, stream), rows, at) for stream in STREAMS[1:]] for at in (ia, ib))
    numbers_match = _numbers_agree(ca, na, cb, nb, n)
    if config.measure == "jaccard":
        return jaccard, jaccard, numbers_match
    own_a, own_b = (va >> (_TAG - 1)) & 1 == 1, (vb >> (_TAG - 1)) & 1 == 1
    own_size_a, own_size_b = _count(pair_a, n, own_a), _count(pair_b, n, own_b)
    b_in_a = _found(full_b, full_a)
    # the row of the pair with fewer own shingles: how much of them, and of each own field, the other holds
    a_smaller = own_size_a <= own_size_b
    x_pairs = np.concatenate((pair_a[own_a & a_smaller[pair_a]], pair_b[own_b & ~a_smaller[pair_b]]))
    x_found = np.concatenate((a_in_b[own_a & a_smaller[pair_a]], b_in_a[own_b & ~a_smaller[pair_b]]))
    x_slot = np.concatenate((va[own_a & a_smaller[pair_a]], vb[own_b & ~a_smaller[pair_b]])) & (FIELD_SLOTS - 1)
    own_size = np.minimum(own_size_a, own_size_b)
    own_in_other = _count(x_pairs, n, x_found)
    whole = inter / np.maximum(np.minimum(size_a, size_b), 1)
    value = np.where(own_size > 0, own_in_other / np.maximum(own_size, 1), whole)
    field = x_pairs.astype(np.int64) * FIELD_SLOTS + x_slot
    per_field = np.bincount(field, weights=x_found, minlength=n * FIELD_SLOTS) / np.maximum(
        np.bincount(field, minlength=n * FIELD_SLOTS), 1)
    held = np.bincount(field, minlength=n * FIELD_SLOTS) > 0
    least_field = np.where(held, per_field, 1.0).reshape(n, FIELD_SLOTS).min(axis=1)
    value = np.where(least_field >= config.field_containment, value, np.minimum(value, least_field))
    few = (own_size > 0) & (own_size < config.min_own_shingles)
    if few.any():  # too little of its own to be found inside another row: Jaccard of the own shingles
        own_inter = _count(pair_a, n, own_a & _found(full_a, (pair_b[own_b], full_b[1][own_b])))
        value[few] = (own_inter / np.maximum(own_size_a + own_size_b - own_inter, 1))[few]
    return value, jaccard, numbers_match


def _ranges(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """The indices start..start+length of every range, concatenated."""
    total = int(lengths.sum())
    if not total:
        return np.empty(0, np.int64)
    shift = np.repeat(starts - np.concatenate(([0], np.cumsum(lengths)[:-1])), lengths)
    return np.arange(total, dtype=np.int64) + shift


@dataclass(frozen=True)
class VerifyPlan:
    folder: Path  # the work folder
    inputs: tuple[Path, ...]  # every pairs file
    parts: int  # partitions of the pairs
    task_starts: np.ndarray  # the first row of every row group (where the shingle spill is found)
    config: DedupConfig


def edges_file(folder: Path, part: int) -> Path:
    return Path(folder) / "edges" / f"{part:05d}.arrow"


class VerifyWorker(TaskWorker):
    """One partition of the candidate pairs: those that are duplicates, with their value and Jaccard."""

    def __init__(self, plan: VerifyPlan):
        self.plan = plan

    def __call__(self, part: int) -> int:
        plan = self.plan
        found = read_partition(list(plan.inputs), PAIRS, part, plan.parts)
        packed = distinct((found["a"].astype(np.uint64) << np.uint64(32)) | found["b"].astype(np.uint64))
        a, b = (packed >> np.uint64(32)).astype(np.int64), (packed & np.uint64(0xFFFFFFFF)).astype(np.int64)
        found = scores(ShingleStore(plan.folder, plan.task_starts), a, b, plan.config)
        keep = found.duplicates(plan.config)
        with batch_file(edges_file(plan.folder, part), EDGES) as writer:
            writer.write_table(pa.table({"a": a[keep], "b": b[keep], "value": found.value[keep], "jaccard": found.jaccard[keep]},
                                        schema=EDGES))
        return len(a)
