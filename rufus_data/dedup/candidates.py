"""Stage 2 of dedup, grouping by sorting: one partition of every task's keys is read, sorted by
(key, row), and each run of equal keys is a group (`GroupWorker` says what a group of each kind
of key means). Candidate pairs (earlier row first) are written out by partition for
verification; no LSH index is held anywhere."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from rufus_data.base.engines import TaskWorker
from rufus_data.dedup.shuffle import KEYED, PAIRS, pair_partition, partitioned_file, read_partition
from rufus_data.dedup.work import save_arrays
from rufus_data.similarity.ngram_hash import distinct, sorted_member

# A bucket of up to this many rows gives every pair of them. A larger one (a row and its copies, or
# a template filled in thousands of times) gives its first row with each other row: linear in its
# size, and the same pairs in every band whose bucket starts with that row, so a row copied 50
# times costs about 50 pairs, not 50 per band. Rows of a bucket whose first row is no duplicate
# of them meet again in the other bands' buckets and in the messages they share.
ALL_PAIRS_UP_TO = 4


def _sorted(keys: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The rows whose key another row has too, sorted by key then row, and whether each starts a
    run of its key. Most keys are a single row's: one plain sort finds the others, and only
    those are sorted by (key, row)."""
    ordered = np.sort(keys)
    shared = sorted_member(keys, distinct(ordered[1:][ordered[1:] == ordered[:-1]]))
    keys, rows = keys[shared], rows[shared]
    order = np.lexsort((rows, keys))
    keys = keys[order]
    starts = np.ones(len(keys), bool)
    starts[1:] = keys[1:] != keys[:-1]
    return rows[order], starts


def repeats_of(keys: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(later row, first row) for every row whose key an earlier row has."""
    rows, starts = _sorted(keys, rows)
    first = np.maximum.accumulate(np.where(starts, np.arange(len(rows)), 0))
    return rows[~starts], rows[first[~starts]]


def bucket_pairs(keys: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The distinct candidate pairs (a < b) of rows that share a key."""
    rows, run_starts = _sorted(keys, rows)
    starts = np.flatnonzero(run_starts)
    sizes = np.diff(np.append(starts, len(rows)))
    firsts, seconds = [np.empty(0, np.int64)], [np.empty(0, np.int64)]
    for size in distinct(sizes[sizes >= 2]).tolist():  # buckets of one size in one step each
        at = starts[sizes == size]
        if size <= ALL_PAIRS_UP_TO:
            i, j = np.triu_indices(size, 1)
        else:
            i, j = np.zeros(size - 1, np.int64), np.arange(1, size)
        firsts.append(rows[(at[:, None] + i[None, :]).ravel()])
        seconds.append(rows[(at[:, None] + j[None, :]).ravel()])
    packed = distinct((np.concatenate(firsts).astype(np.uint64) << np.uint64(32)) | np.concatenate(seconds).astype(np.uint64))
    return (packed >> np.uint64(32)).astype(np.int64), (packed & np.uint64(0xFFFFFFFF)).astype(np.int64)


def field_groups(keys: np.ndarray, rows: np.ndarray, min_rows: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(the sorted keys that at least `min_rows` distinct rows hold: scaffold, and the candidate
    pairs of the rows that share any other key)."""
    order = np.lexsort((rows, keys))
    keys, rows = keys[order], rows[order]
    new_pair = np.ones(len(keys), bool)
    new_pair[1:] = (keys[1:] != keys[:-1]) | (rows[1:] != rows[:-1])
    keys, rows = keys[new_pair], rows[new_pair]  # each (key, row) once, by key
    starts = np.flatnonzero(np.concatenate(([True], keys[1:] != keys[:-1]))) if len(keys) else np.empty(0, np.int64)
    sizes = np.diff(np.append(starts, len(keys)))
    common = np.repeat(sizes >= min_rows, sizes)
    a, b = bucket_pairs(keys[~common], rows[~common])
    return keys[starts[sizes >= min_rows]], a, b


KINDS = ("origins", "sets", "bands", "fields")  # the keys sketched, grouped in this order


@dataclass(frozen=True)
class GroupPlan:
    folder: Path  # the work folder
    kind: str  # one of KINDS
    inputs: tuple[Path, ...]  # every sketch task's file of these keys
    parts: int  # partitions of the inputs
    pair_parts: int  # partitions of the candidate pairs written
    skip_mask: Path | None  # rows left out (bool per row): for sets the repeats, for bands and fields also the copies
    scaffold_rows: int = 0  # fields: a field held by this many distinct rows is scaffold


def group_file(folder: Path, kind: str, part: int) -> Path:
    """A partition's followers (origins: repeats; sets: exact copies) as (rows, first); written last."""
    return Path(folder) / "groups" / f"{kind}-{part:05d}.npz"


def pairs_file(folder: Path, kind: str, part: int) -> Path:
    return Path(folder) / "pairs" / f"{kind}-{part:05d}.arrow"


class GroupWorker(TaskWorker):
    """One partition of one kind of key, grouped by sorting:

    origins  each group's later rows are a mix's repeats of its first row (never compared);
    sets     rows with the same shingle set: each later row is a candidate duplicate of the
             first (verified like any pair) and is left out of the bands, where it would only
             repeat the first row's pairs (a row copied 10,000 times is 9,999 pairs, not 50 million);
    bands    each LSH bucket's candidate pairs;
    fields   whole fields (messages): those held by at least `scaffold_rows` rows are scaffold
             (a system prompt or instruction many rows share), which verification does not
             count as a row's own content; rows sharing any other field are candidate pairs
             (a short row under a new preamble keeps its answer verbatim, where its Jaccard
             with its copy may be too low for the bands)."""

    def __init__(self, plan: GroupPlan):
        self.plan = plan

    def done_file(self, part: int) -> Path:
        plan = self.plan
        return pairs_file(plan.folder, plan.kind, part) if plan.kind == "bands" else group_file(plan.folder, plan.kind, part)

    def __call__(self, part: int) -> int:
        plan = self.plan
        found = read_partition(list(plan.inputs), KEYED, part, plan.parts)
        keys, rows = found["key"], found["row"]
        if plan.skip_mask is not None and len(rows):
            keep = ~np.load(plan.skip_mask, mmap_mode="r")[rows]
            keys, rows = keys[keep], rows[keep]
        if plan.kind == "fields":
            scaffold, a, b = field_groups(keys, rows, plan.scaffold_rows)
        elif plan.kind == "bands":
            a, b = bucket_pairs(keys, rows)
        else:
            b, a = repeats_of(keys, rows)
        if plan.kind != "origins":
            with partitioned_file(pairs_file(plan.folder, plan.kind, part), PAIRS, plan.pair_parts) as add:
                add(pair_partition(a, b, plan.pair_parts), a=a, b=b)
        if plan.kind == "fields":  # written last: the task is done
            save_arrays(group_file(plan.folder, plan.kind, part), keys=scaffold)
        elif plan.kind != "bands":
            save_arrays(group_file(plan.folder, plan.kind, part), rows=b, first=a)
        return len(b)
