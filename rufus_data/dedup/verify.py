"""Stage 3 of dedup, verification: every candidate pair counts only if the exact Jaccard
similarity of the two rows' shingle sets reaches the threshold.

No row's shingles are held for the run: first the rows that are in some candidate pair (a
small share of the rows, unless the data is mostly duplicates) are read again and shingled,
row group by row group, into spill files (`ShingleWorker`); then each partition of the pairs is
verified in chunks of a bounded number of shingles, reading just the rows each chunk needs
(`VerifyWorker`)."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa

from rufus_data.dedup.config import DedupConfig
from rufus_data.dedup.shuffle import PAIRS, read_partition
from rufus_data.dedup.signatures import row_shingles
from rufus_data.dedup.work import batch_file, load_arrays, save_arrays, write_atomic
from rufus_data.engines import RowGroupTask, TaskWorker
from rufus_data.similarity.ngram_hash import TokenHasher, distinct

EDGES = pa.schema([("a", pa.int64()), ("b", pa.int64()), ("jaccard", pa.float64())])
CHUNK_SHINGLES = 4_000_000  # shingles of both rows of the pairs verified at once (8 bytes each, sorted)
COALESCE_BYTES = 1 << 16  # reads of one spill file closer than this are made as one


def shingle_files(folder: Path, first_row: int) -> tuple[Path, Path]:
    """(the shingles, the index: rows and offsets) of the candidate rows of the task starting at
    `first_row`; the index is written last."""
    base = Path(folder) / "shingles" / f"{first_row:012d}"
    return base.with_suffix(".bin"), base.with_suffix(".index.npz")


class ShingleWorker(TaskWorker):
    """The shingle sets of one row group's candidate rows (`candidates`: a bool per row, saved
    by the parent), into the spill."""

    def __init__(self, config: DedupConfig, folder: Path, candidates: Path):
        self.config, self.folder, self.candidates = config, folder, candidates

    def setup(self, one_cpu: bool) -> None:
        super().setup(one_cpu)
        self.hasher = TokenHasher()

    def __call__(self, task: RowGroupTask) -> int:
        wanted = np.load(self.candidates, mmap_mode="r")
        data_path, index_path = shingle_files(self.folder, task.first_row)
        rows, offsets = [], [np.zeros(1, np.int64)]
        written = 0

        def write(tmp: Path) -> None:
            nonlocal written
            with open(tmp, "wb") as fh:
                for first, table in task.batches():
                    local = np.flatnonzero(wanted[first : first + table.num_rows])
                    if not len(local):
                        continue
                    sets = row_shingles(table.take(pa.array(local)), self.config.shingle, self.hasher)
                    fh.write(sets.shingles.tobytes())
                    rows.append(first + local)
                    offsets.append(written + sets.offsets[1:])
                    written += len(sets.shingles)

        write_atomic(data_path, write)
        save_arrays(index_path, rows=np.concatenate(rows) if rows else np.empty(0, np.int64), offsets=np.concatenate(offsets))
        return task.rows


class ShingleStore:
    """Reads the shingle sets of given rows back from the spill of `ShingleWorker`."""

    def __init__(self, folder: Path, task_starts: np.ndarray):
        self.folder, self.task_starts = Path(folder), task_starts
        self._index: dict[int, tuple[np.ndarray, np.ndarray]] = {}

    def _task_index(self, task: int) -> tuple[np.ndarray, np.ndarray]:
        if task not in self._index:
            found = load_arrays(shingle_files(self.folder, int(self.task_starts[task]))[1])
            self._index[task] = (found["rows"], found["offsets"])
        return self._index[task]

    def _where(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(task, start, end) in the spill of each of these rows."""
        tasks = np.searchsorted(self.task_starts, rows, side="right") - 1
        starts, ends = np.empty(len(rows), np.int64), np.empty(len(rows), np.int64)
        for task in distinct(tasks).tolist():
            at = np.flatnonzero(tasks == task)
            index_rows, offsets = self._task_index(task)
            pos = np.searchsorted(index_rows, rows[at])
            starts[at], ends[at] = offsets[pos], offsets[pos + 1]
        return tasks, starts, ends

    def sizes(self, rows: np.ndarray) -> np.ndarray:
        _, starts, ends = self._where(rows)
        return ends - starts

    def load(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The sets of `rows` (sorted, distinct): (shingles, offsets), row by row."""
        tasks, starts, ends = self._where(rows)
        offsets = np.concatenate(([0], np.cumsum(ends - starts)))
        out = np.empty(int(offsets[-1]), np.uint32)
        for task in distinct(tasks).tolist():
            at = np.flatnonzero(tasks == task)
            with open(shingle_files(self.folder, int(self.task_starts[task]))[0], "rb") as fh:
                for lo, hi in _coalesced(starts[at], ends[at]):
                    fh.seek(4 * int(starts[at[lo]]))
                    span = np.frombuffer(fh.read(4 * int(ends[at[hi - 1]] - starts[at[lo]])), np.uint32)
                    base = int(starts[at[lo]])
                    for k in at[lo:hi].tolist():
                        out[offsets[k] : offsets[k + 1]] = span[starts[k] - base : ends[k] - base]
        return out, offsets


def _coalesced(starts: np.ndarray, ends: np.ndarray) -> list[tuple[int, int]]:
    """Runs [lo, hi) of rows (in file order) whose reads are close enough to make as one."""
    gaps = starts[1:] - ends[:-1]
    cuts = np.flatnonzero(gaps * 4 > COALESCE_BYTES) + 1
    bounds = np.concatenate(([0], cuts, [len(starts)])).tolist()
    return list(itertools.pairwise(bounds))


def jaccard(store: ShingleStore, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The exact Jaccard similarity of each pair's shingle sets, in chunks of at most
    CHUNK_SHINGLES shingles."""
    out = np.empty(len(a), np.float64)
    if not len(a):
        return out
    needed = distinct(np.concatenate((a, b)))
    size = store.sizes(needed)
    volume = size[np.searchsorted(needed, a)] + size[np.searchsorted(needed, b)]
    cuts = np.flatnonzero(np.diff(np.cumsum(volume) // CHUNK_SHINGLES)) + 1
    bounds = np.concatenate(([0], cuts, [len(a)])).tolist()
    for lo, hi in itertools.pairwise(bounds):
        out[lo:hi] = _chunk_jaccard(store, a[lo:hi], b[lo:hi])
    return out


def _chunk_jaccard(store: ShingleStore, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    rows = distinct(np.concatenate((a, b)))
    shingles, offsets = store.load(rows)
    pa_, pb = np.searchsorted(rows, a), np.searchsorted(rows, b)
    size_a, size_b = offsets[pa_ + 1] - offsets[pa_], offsets[pb + 1] - offsets[pb]
    # every pair's shingles from both sides, tagged with the pair: a shingle seen twice is shared
    pair = np.arange(len(a), dtype=np.uint64)
    tagged = np.concatenate((
        (np.repeat(pair, size_a) << np.uint64(32)) | shingles[_ranges(offsets[pa_], size_a)],
        (np.repeat(pair, size_b) << np.uint64(32)) | shingles[_ranges(offsets[pb], size_b)],
    ))
    tagged.sort()
    shared = tagged[1:][tagged[1:] == tagged[:-1]] >> np.uint64(32)
    inter = np.bincount(shared.astype(np.int64), minlength=len(a))
    return inter / (size_a + size_b - inter)  # rows in pairs have words: never 0 / 0


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
    threshold: float


def edges_file(folder: Path, part: int) -> Path:
    return Path(folder) / "edges" / f"{part:05d}.arrow"


class VerifyWorker(TaskWorker):
    """One partition of the candidate pairs: those whose exact Jaccard reaches the threshold."""

    def __init__(self, plan: VerifyPlan):
        self.plan = plan

    def __call__(self, part: int) -> int:
        plan = self.plan
        found = read_partition(list(plan.inputs), PAIRS, part, plan.parts)
        packed = distinct((found["a"].astype(np.uint64) << np.uint64(32)) | found["b"].astype(np.uint64))
        a, b = (packed >> np.uint64(32)).astype(np.int64), (packed & np.uint64(0xFFFFFFFF)).astype(np.int64)
        score = jaccard(ShingleStore(plan.folder, plan.task_starts), a, b)
        keep = score >= plan.threshold
        with batch_file(edges_file(plan.folder, part), EDGES) as writer:
            writer.write_table(pa.table({"a": a[keep], "b": b[keep], "jaccard": score[keep]}, schema=EDGES))
        return len(a)
