"""`rufus-data decontam`: find training rows that contain benchmark items, say which item and why,
and write the clean shards.

Stage 1 (exact): word n-grams (n=8) of every eval problem (and of distinctive answers) are
indexed once; every text field of a training row is scanned in numpy batches. An eval text
shorter than n words is one whole-text gram.
Stage 2 (near duplicates): MinHash over word shingles (eval items with datasketch's
`MinHash.bulk`; training windows with `BatchMinHasher`, bit-identical to it); the eval items'
signatures are banded into a `BandIndex` (LSH), each training field (cut into windows about an
eval item long) queries it, and every candidate is re-checked exactly: the *containment* of the
eval item's shingle set in the field's shingle set must reach the threshold.
Boilerplate never counts: n-grams shared by many eval items (families of perturbed items count
once) or matched in many training rows, and shingles common across eval items, are ignored.
Every split of the shard folder (train, holdout, ...) is scanned and written. See docs/decontam.md."""

from __future__ import annotations

import json
import os
import pickle
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pydantic import BaseModel, ConfigDict, Field

from rufus_data.benchmarks import EvalItem, load_benchmarks
from rufus_data.errors import RufusError
from rufus_data.sketch import (
    BandIndex,
    BatchMinHasher,
    shingles_of,
    signatures,
    sorted_member,
    text_fields,
    tokenize_batch,
)
from rufus_data.textnorm import (
    TokenHasher,
    batch_gram_hashes,
    fold32,
    gram_hashes,
    rolling_gram_hashes,
)


class DecontamConfig(BaseModel):
    """Every knob of decontam; the defaults are the measured ones in docs/decontam.md."""

    model_config = ConfigDict(extra="forbid")

    ngram: int = Field(8, ge=1, description="word n-gram length of the exact stage")
    shingle: int = Field(2, ge=1, description="word shingle length of the MinHash stage")
    num_perm: int = Field(64, ge=16, description="MinHash permutations")
    lsh_threshold: float = Field(0.2, gt=0, le=1, description="Jaccard threshold of the LSH candidate index")
    containment: float = Field(0.5, gt=0, le=1, description="min containment of an eval item in a field (stage 2)")
    window: int = Field(96, ge=8, description="training fields longer than this (shingles) are cut into windows")
    min_item_shingles: int = Field(8, ge=1, description="eval items with fewer shingles skip stage 2")
    min_shared_shingles: int = Field(6, ge=1, description="a MinHash hit also needs this many shared shingles")
    min_answer_words: int = Field(8, ge=1, description="an answer this long counts on its own; shorter only with its problem")
    answer_min_share: float = Field(0.5, gt=0, le=1, description="an answer hit alone needs this share of its n-grams")
    min_matched_grams: int = Field(3, ge=1, description="exact hits need this many n-grams (all of a shorter item's)")
    max_items_per_gram: int = Field(4, ge=1, description="an n-gram in more eval items (families) than this is boilerplate")
    max_row_fraction: float = Field(0.01, gt=0, le=1, description="an n-gram matched in more than this share of rows is boilerplate")
    min_rows_boilerplate: int = Field(50, ge=1, description="...but never below this many rows")
    max_shingle_item_fraction: float = Field(0.02, gt=0, le=1, description="shingles in more eval items than this share are ignored")
    batch_rows: int = Field(2000, ge=1)
    workers: int = Field(0, ge=0, description="processes; 0 = one per CPU (in-process below 20k rows)")
    engine: Literal["local", "ray"] = "local"
    seed: int = 1


# ----------------------------------------------------------------------------------- the index
@dataclass
class Postings:
    """gram -> eval items, in numpy arrays (pickles in milliseconds, unlike a dict of lists)."""

    keys: np.ndarray  # sorted distinct gram hashes
    starts: np.ndarray  # keys[i]'s entries are items[starts[i]:starts[i+1]]
    items: np.ndarray
    is_answer: np.ndarray

    def __len__(self) -> int:
        return len(self.keys)

    def lookup_many(self, grams: np.ndarray) -> list[list[tuple[int, bool]]]:
        """Entries of each gram (all of them must be keys)."""
        where = np.searchsorted(self.keys, grams)
        starts, stops = self.starts[where].tolist(), self.starts[where + 1].tolist()
        return [list(zip(self.items[a:b].tolist(), self.is_answer[a:b].tolist())) for a, b in zip(starts, stops)]


@dataclass
class EvalIndex:
    """Everything a worker needs about the eval side; built once, pickled to workers."""

    config: DecontamConfig
    items: list[EvalItem]
    gram_lengths: list[int]  # n, plus the lengths of short whole-text grams
    keys: dict[int, np.ndarray]  # length -> sorted gram hashes
    bitmap: np.ndarray  # bool[2^22]: a cheap first filter, True where some key's low bits point
    bitmap_mask: np.uint64
    postings: Postings  # gram hash -> (item index, problem or answer), as flat numpy arrays
    item_grams: np.ndarray  # per item: distinct problem grams (containment denominator)
    answer_grams: np.ndarray  # per item: distinct indexed answer grams
    short_answers: dict[int, list[np.ndarray]]  # item -> token ids of short answers
    item_shingles: list[np.ndarray]  # per item: sorted distinct shingles minus common ones
    lsh: BandIndex  # the MinHash signatures of eval items with enough shingles, banded
    hasher: BatchMinHasher
    boilerplate_eval_grams: int = 0
    common_shingles: int = 0
    _sets: dict[int, frozenset[int]] = field(default_factory=dict, repr=False)

    def item_set(self, item: int) -> frozenset[int]:
        """An eval item's shingles as a set (made on first use in each worker)."""
        got = self._sets.get(item)
        if got is None:
            got = self._sets[item] = frozenset(self.item_shingles[item].tolist())
        return got

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_sets": {}}


def _gram_postings(parts, max_items: int, item_family: np.ndarray) -> tuple[Postings, dict[int, np.ndarray], int]:
    """Vectorised: one entry per (gram, item), problem before answer; grams in more than
    `max_items` distinct eval item families (`item_family[item]`: perturbations of one seed
    question are one family, other items their own) are boilerplate and left out. Returns the
    postings, the sorted keys per gram length, and how many grams were boilerplate."""
    if not parts:
        empty = np.empty(0, np.uint64)
        return Postings(empty, np.zeros(1, np.int64), np.empty(0, np.int64), np.empty(0, bool)), {}, 0
    grams = np.concatenate([p[0] for p in parts])
    sizes = [len(p[0]) for p in parts]
    items = np.repeat([p[1] for p in parts], sizes).astype(np.int64)
    is_answer = np.repeat([p[2] for p in parts], sizes).astype(bool)
    lengths = np.repeat([p[3] for p in parts], sizes).astype(np.int64)
    order = np.lexsort((is_answer, items, grams))
    grams, items, is_answer, lengths = grams[order], items[order], is_answer[order], lengths[order]
    first = np.ones(len(grams), dtype=bool)
    first[1:] = (grams[1:] != grams[:-1]) | (items[1:] != items[:-1])
    grams, items, is_answer, lengths = grams[first], items[first], is_answer[first], lengths[first]
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
    postings = Postings(keys, offsets, items[keep], is_answer[keep])
    by_length = {int(n): keys[key_lengths == n] for n in np.unique(key_lengths)}
    return postings, by_length, int((~keep_gram).sum())


def build_index(items: list[EvalItem], config: DecontamConfig) -> EvalIndex:
    hasher = TokenHasher()
    n = config.ngram
    parts: list[tuple[np.ndarray, int, bool, int]] = []  # (distinct grams, item, is answer, gram length)
    item_grams = np.zeros(len(items), dtype=np.int64)
    answer_grams = np.zeros(len(items), dtype=np.int64)
    short_answers: dict[int, list[np.ndarray]] = {}

    def add(text_ids: np.ndarray, item: int, kind: str, alpha: np.ndarray | None = None) -> int:
        size = min(n, len(text_ids))
        grams = gram_hashes(text_ids, size)
        if alpha is not None and len(text_ids) >= n:  # answers: only grams with >= 3 words of letters
            letters = np.convolve(alpha.astype(np.int64), np.ones(n, dtype=np.int64), mode="valid")
            grams = grams[letters >= 3]
        grams = np.unique(grams)
        parts.append((grams, item, kind == "answer", size))
        return len(grams)

    # tokenise every eval text in one batch (the same normalisation as the training side)
    texts, owners = [], []
    for i, item in enumerate(items):
        texts += [*item.problems, *item.answers]
        owners += [(i, "problem")] * len(item.problems) + [(i, "answer")] * len(item.answers)
    flat, all_ids, offsets = tokenize_batch(texts, hasher)
    alpha_all = pc.utf8_is_alpha(pc.utf8_slice_codeunits(flat, 0, 1)).to_numpy(zero_copy_only=False) if len(flat) else np.zeros(0, bool)
    shingles: dict[int, list[np.ndarray]] = defaultdict(list)
    for t, (i, kind) in enumerate(owners):
        ids = all_ids[offsets[t] : offsets[t + 1]]
        if not len(ids):
            continue
        if kind == "problem":
            item_grams[i] += add(ids, i, "problem")
            shingles[i].append(shingles_of(ids, config.shingle))
        elif len(ids) >= config.min_answer_words:
            answer_grams[i] += add(ids, i, "answer", alpha_all[offsets[t] : offsets[t + 1]])
        else:
            short_answers.setdefault(i, []).append(ids)
    shingle_sets = [np.unique(np.concatenate(shingles[i])) if shingles[i] else np.empty(0, np.uint32)
                    for i in range(len(items))]

    family_of: dict[tuple[str, str], int] = {}
    item_family = np.asarray([family_of.setdefault((it.benchmark, it.group or f"\0{it.item_id}"), len(family_of))
                              for it in items], dtype=np.int64)
    postings, key_arrays, n_boiler = _gram_postings(parts, config.max_items_per_gram, item_family)
    bitmap_mask = np.uint64((1 << 22) - 1)
    bitmap = np.zeros(1 << 22, dtype=bool)
    for arr in key_arrays.values():
        bitmap[(arr & bitmap_mask).astype(np.int64)] = True

    # stage 2: shingles common to many eval items ("how many", "of the") carry no identity
    common: set[int] = set()
    if shingle_sets:
        # counted per family too: one family's shared wording is its identity, not boilerplate
        per_family = np.concatenate([shingle_sets[m[0]] if len(m) == 1 else np.unique(np.concatenate([shingle_sets[i] for i in m]))
                                     for m in _members(item_family)])
        values, counts = np.unique(per_family, return_counts=True)
        limit = max(2, int(config.max_shingle_item_fraction * len(family_of)))
        common = set(values[counts > limit].tolist())
    common_arr = np.asarray(sorted(common), dtype=np.uint32)
    item_shingles = [s[~np.isin(s, common_arr)] for s in shingle_sets]
    lsh = BandIndex(config.lsh_threshold, config.num_perm)
    eligible = [i for i, s in enumerate(item_shingles) if len(s) >= config.min_item_shingles]
    if eligible:
        sketches = signatures([item_shingles[i] for i in eligible], config.num_perm, config.seed)
        lsh.build(np.stack([m.hashvalues for m in sketches]), eligible)
    return EvalIndex(config, items, sorted(key_arrays, reverse=True), key_arrays, bitmap, bitmap_mask,
                     postings, item_grams,
                     answer_grams, short_answers, item_shingles, lsh, BatchMinHasher(config.num_perm, config.seed),
                     n_boiler, len(common))


def _members(family: np.ndarray) -> list[np.ndarray]:
    """Item indices of each family, family by family."""
    order = np.argsort(family, kind="stable")
    cuts = np.flatnonzero(np.diff(family[order])) + 1
    return np.split(order, cuts) if len(order) else []


# ------------------------------------------------------------------------------ scanning rows
@dataclass
class Candidate:
    """One (training row, eval item) pair found by a worker, before the parent's final rules."""

    row: int  # global row number in the input
    row_id: str
    source: str
    item: int
    fields: set[str] = field(default_factory=set)
    problem_grams: dict[int, str] = field(default_factory=dict)  # gram hash -> matched text
    answer_grams: dict[int, str] = field(default_factory=dict)
    containment: float = 0.0  # stage 2, exact on shingle sets
    short_answer_hit: bool = False


def _contains(haystack: np.ndarray, needle: np.ndarray) -> bool:
    """Whether token-id sequence `needle` occurs in `haystack` (short answers only)."""
    m = len(needle)
    if m == 0 or len(haystack) < m:
        return False
    starts = np.flatnonzero(haystack[: len(haystack) - m + 1] == needle[0])
    return any(np.array_equal(haystack[s : s + m], needle) for s in starts)


def scan_table(table: pa.Table, index: EvalIndex, first_row: int, hasher: TokenHasher | None = None) -> list[Candidate]:
    """Both stages on one batch of canonical rows; returns raw candidates for the parent."""
    hasher = hasher or TokenHasher()
    texts, row_of, names = text_fields(table)
    if not texts:
        return []
    ids_col = table.column("id").to_pylist() if "id" in table.column_names else [str(first_row + i) for i in range(table.num_rows)]
    src_col = table.column("source").to_pylist() if "source" in table.column_names else [""] * table.num_rows
    tokens, ids, offsets = tokenize_batch(texts, hasher)
    found: dict[tuple[int, int], Candidate] = {}

    def cand(local_row: int, item: int) -> Candidate:
        key = (local_row, item)
        if key not in found:
            found[key] = Candidate(first_row + local_row, str(ids_col[local_row]), str(src_col[local_row] or ""), item)
        return found[key]

    # stage 1: exact n-grams (and short whole-text grams), vectorised over the batch: one rolling
    # pass for all gram lengths, a bitmap to discard almost every gram, np.isin for the rest
    for length, grams in rolling_gram_hashes(ids, index.gram_lengths):
        maybe = np.flatnonzero(index.bitmap[(grams & index.bitmap_mask).astype(np.int64)])
        if not len(maybe):
            continue
        hit = maybe[sorted_member(grams[maybe], index.keys[length])]
        owner = np.searchsorted(offsets, hit, side="right") - 1
        inside = hit + length <= offsets[owner + 1]  # the gram does not cross into the next text
        hit, owner = hit[inside], owner[inside]
        for start, t, entries in zip(hit.tolist(), owner.tolist(), index.postings.lookup_many(grams[hit])):
            gram = int(grams[start])
            text = " ".join(tokens[start : start + length].to_pylist())
            for item, is_answer in entries:
                c = cand(int(row_of[t]), item)
                c.fields.add(names[t])
                (c.answer_grams if is_answer else c.problem_grams)[gram] = text

    # stage 2: MinHash of every field window, LSH band candidates, exact containment re-check
    if len(index.lsh.keys):
        _near_duplicates(index, ids, offsets, row_of, names, cand)

    # short answers: only where the same item's problem hit this row (exactly or by MinHash)
    if index.short_answers:
        row_tokens: dict[int, np.ndarray] = {}
        for (local_row, item), c in found.items():
            if item in index.short_answers and (c.problem_grams or c.containment >= index.config.containment):
                if local_row not in row_tokens:
                    parts = [ids[offsets[t] : offsets[t + 1]] for t in np.flatnonzero(row_of == local_row)]
                    row_tokens[local_row] = np.concatenate(parts) if parts else np.empty(0, np.uint64)
                c.short_answer_hit = any(_contains(row_tokens[local_row], a) for a in index.short_answers[item])
    return [c for c in found.values() if _may_count(c, index)]


def _may_count(c: Candidate, index: EvalIndex) -> bool:
    """Whether a candidate can pass `finalize` (which only ever removes grams): the rest need
    not travel back from the worker."""
    cfg = index.config
    if c.containment >= cfg.containment:
        return True
    if len(c.problem_grams) >= min(cfg.min_matched_grams, max(1, int(index.item_grams[c.item]))):
        return True
    answers = int(index.answer_grams[c.item])
    return len(c.answer_grams) >= min(max(cfg.min_matched_grams, cfg.answer_min_share * answers), max(1, answers))


def _near_duplicates(index: EvalIndex, ids: np.ndarray, offsets: np.ndarray, row_of: np.ndarray,
                     names: list[str], cand) -> None:
    """Stage 2 for one batch. Fields are cut into chunks of window/2 shingles; a window is two
    neighbouring chunks, so an eval item about a window long always lies mostly inside one."""
    cfg = index.config
    grams, owner = batch_gram_hashes(ids, offsets, cfg.shingle)
    if not len(grams):
        return
    shingles = fold32(grams)
    counts = np.bincount(owner, minlength=len(offsets) - 1)
    keep_field = counts >= max(1, int(np.ceil(cfg.containment * cfg.min_item_shingles)))
    if not keep_field.any():
        return
    mask = keep_field[owner]
    shingles, owner = shingles[mask], owner[mask]
    fields = np.flatnonzero(keep_field)
    counts = counts[fields]
    field_start = np.concatenate(([0], np.cumsum(counts)[:-1]))
    stride = max(1, cfg.window // 2)
    n_chunks = -(-counts // stride)
    chunk_field = np.repeat(np.arange(len(fields)), n_chunks)
    chunk_rank = np.arange(len(chunk_field)) - np.repeat(np.concatenate(([0], np.cumsum(n_chunks)[:-1])), n_chunks)
    chunk_start = field_start[chunk_field] + chunk_rank * stride
    sigs = index.hasher.segments(shingles, chunk_start)
    # windows: chunk j joined with chunk j+1 of the same field; a one-chunk field is its own window
    pair = np.flatnonzero(chunk_field[:-1] == chunk_field[1:])
    single = np.flatnonzero(n_chunks == 1)
    single_chunk = np.concatenate(([0], np.cumsum(n_chunks)[:-1]))[single]
    window_sigs = np.concatenate((np.minimum(sigs[pair], sigs[pair + 1]), sigs[single_chunk]))
    window_field = np.concatenate((chunk_field[pair], chunk_field[single_chunk]))
    field_sets: dict[int, set[int]] = {}
    checked: set[tuple[int, int]] = set()
    for w, item in index.lsh.candidates(window_sigs):
        f = int(window_field[w])
        if (f, item) in checked:
            continue
        checked.add((f, item))
        if f not in field_sets:
            lo = int(field_start[f])
            field_sets[f] = set(shingles[lo : lo + int(counts[f])].tolist())
        needle = index.item_set(item)  # small sets: Python's set intersection beats numpy here
        shared = len(needle & field_sets[f])
        score = shared / len(needle)
        if score >= cfg.containment and shared >= cfg.min_shared_shingles:
            t = int(fields[f])
            c = cand(int(row_of[t]), item)
            c.fields.add(names[t])
            c.containment = max(c.containment, score)


# --------------------------------------------------------------------------- running the scan
@dataclass(frozen=True)
class Task:
    """One parquet row group of one shard: read once, scanned in batches of `batch_rows`."""

    path: str
    row_group: int
    rows: int
    first_row: int  # global row number of its first row
    batch_rows: int


def _plan(files: list[Path], batch_rows: int) -> tuple[list[Task], int]:
    tasks, total = [], 0
    for path in files:
        meta = pq.ParquetFile(path).metadata
        for group in range(meta.num_row_groups):
            rows = meta.row_group(group).num_rows
            tasks.append(Task(str(path), group, rows, total, batch_rows))
            total += rows
    return tasks, total


def _scan_task(task: Task, index: EvalIndex, hasher: TokenHasher) -> list[Candidate]:
    table = pq.ParquetFile(task.path).read_row_group(task.row_group)
    found: list[Candidate] = []
    for start in range(0, table.num_rows, task.batch_rows):
        found += scan_table(table.slice(start, task.batch_rows), index, task.first_row + start, hasher)
    return found


_WORKER_INDEX: EvalIndex | None = None
_WORKER_HASHER: TokenHasher | None = None


def _init_worker(index_bytes: bytes | None) -> None:
    global _WORKER_INDEX, _WORKER_HASHER
    if index_bytes is not None:
        _WORKER_INDEX = pickle.loads(index_bytes)
    _WORKER_HASHER = TokenHasher()


def _run_task(task: Task) -> tuple[Task, list[Candidate]]:
    return task, _scan_task(task, _WORKER_INDEX, _WORKER_HASHER)


def _scan_local(tasks: list[Task], index: EvalIndex, workers: int, on_done) -> list[Candidate]:
    found: list[Candidate] = []
    global _WORKER_INDEX
    if workers <= 1 or len(tasks) <= 1:
        _WORKER_INDEX = index
        _init_worker(None)
        for task in tasks:
            _, cands = _run_task(task)
            found += cands
            on_done(task)
        return found
    import multiprocessing as mp

    if "fork" in mp.get_all_start_methods():  # workers inherit the index: nothing to pickle
        _WORKER_INDEX, ctx, initargs = index, mp.get_context("fork"), (None,)
    else:
        ctx, initargs = mp.get_context("spawn"), (pickle.dumps(index),)
    import gc

    gc.freeze()  # forked workers would otherwise copy every page the garbage collector walks
    try:
        with ctx.Pool(workers, initializer=_init_worker, initargs=initargs) as pool:
            for task, cands in pool.imap_unordered(_run_task, tasks):
                found += cands
                on_done(task)
    finally:
        gc.unfreeze()
    return found


def _scan_ray(tasks: list[Task], index: EvalIndex, on_done) -> list[Candidate]:
    """The same per-task work as Ray Data tasks (on the cluster `ray.init()` connects to)."""
    try:
        import ray
    except ImportError:
        raise RufusError("--engine ray needs Ray Data: pip install 'rufus[ray]'") from None
    if not ray.is_initialized():
        ray.init(address=os.environ.get("RAY_ADDRESS"), ignore_reinit_error=True, log_to_driver=False)
    index_bytes = pickle.dumps(index)

    class ScanTasks:
        def __init__(self):
            _init_worker(index_bytes)

        def __call__(self, batch: dict) -> dict:
            out = []
            for blob in batch["task"]:
                out.append(pickle.dumps(_run_task(pickle.loads(blob))))
            return {"result": out}

    import logging

    import ray.data

    logging.getLogger("ray.data").setLevel(logging.WARNING)  # Rufus shows its own progress
    ray.data.DataContext.get_current().enable_progress_bars = False
    ds = ray.data.from_items([{"task": pickle.dumps(t)} for t in tasks], override_num_blocks=len(tasks))
    results = ds.map_batches(ScanTasks, batch_size=1, concurrency=max(1, int(ray.available_resources().get("CPU", 1))))
    found: list[Candidate] = []
    for row in results.iter_rows():
        task, cands = pickle.loads(row["result"])
        found += cands
        on_done(task)
    return found


# ------------------------------------------------------------------------- final rules, output
HIT_SCHEMA = pa.schema([
    ("row_id", pa.string()), ("row", pa.int64()), ("source", pa.string()), ("benchmark", pa.string()),
    ("eval_item_id", pa.string()), ("method", pa.string()), ("fields", pa.list_(pa.string())),
    ("matched_ngrams", pa.list_(pa.string())), ("n_matched", pa.int64()), ("containment", pa.float64()),
    ("answer_hit", pa.bool_()),
])


@dataclass
class DecontamResult:
    hits: pa.Table
    rows_in: int
    rows_out: int
    flagged_rows: set[int]
    missing: dict[str, str]
    benchmarks: dict[str, dict]
    boilerplate_train_grams: list[str]
    index_stats: dict
    seconds: float
    out: Path | None = None
    not_decontaminable: dict[str, str] = field(default_factory=dict)  # suite/task -> why (--against-suite)
    splits: dict[str, dict[str, int]] = field(default_factory=dict)  # split -> {"rows", "flagged"}


def finalize(cands: list[Candidate], index: EvalIndex, rows_in: int) -> tuple[pa.Table, list[str]]:
    """Apply the rules that need the whole corpus: training-side boilerplate and the answer rule."""
    cfg = index.config
    rows_per_gram: dict[int, set[int]] = defaultdict(set)
    gram_text: dict[int, str] = {}
    for c in cands:
        for g, text in (*c.problem_grams.items(), *c.answer_grams.items()):
            rows_per_gram[g].add(c.row)
            gram_text[g] = text
    limit = max(cfg.min_rows_boilerplate, int(cfg.max_row_fraction * rows_in))
    boiler = {g for g, rows in rows_per_gram.items() if len(rows) > limit}
    out = []
    for c in sorted(cands, key=lambda c: (c.row, c.item)):
        item = index.items[c.item]
        problem = {g: t for g, t in c.problem_grams.items() if g not in boiler}
        answer = {g: t for g, t in c.answer_grams.items() if g not in boiler}
        if len(problem) < min(cfg.min_matched_grams, max(1, int(index.item_grams[c.item]))):
            problem = {}  # one shared 8-gram ("on the first day on the second day") is a phrase, not a leak
        need = max(cfg.min_matched_grams, cfg.answer_min_share * int(index.answer_grams[c.item]))
        if answer and not problem and len(answer) < min(need, max(1, int(index.answer_grams[c.item]))):
            answer = {}  # a few shared phrases of a worked solution are not a leak of it
        if problem or answer:
            method = "exact"
            matched = sorted(set(problem.values()) | set(answer.values()))
            denom = max(1, int(index.item_grams[c.item]))
            score = (min(1.0, len(problem) / denom) if problem
                     else min(1.0, len(answer) / max(1, int(index.answer_grams[c.item]))))
            score = max(score, c.containment)
        elif c.containment >= cfg.containment:
            method, matched, score = "minhash", [], c.containment
        else:
            continue
        out.append({"row_id": c.row_id, "row": c.row, "source": c.source, "benchmark": item.benchmark,
                    "eval_item_id": item.item_id, "method": method, "fields": sorted(c.fields),
                    "matched_ngrams": matched[:20], "n_matched": len(problem) + len(answer), "containment": round(score, 4),
                    "answer_hit": bool(answer) or c.short_answer_hit})
    return pa.Table.from_pylist(out, schema=HIT_SCHEMA), sorted(gram_text[g] for g in boiler)


def decontaminate(shards: str | Path, against: list[str], out: str | Path | None = None, *,
                  benchmarks_file: str | Path | None = None, skip_missing: bool = False, dry_run: bool = False,
                  overwrite: bool = False, config: DecontamConfig | None = None, show_progress: bool = True,
                  suites: list[str] = ()) -> DecontamResult:
    """Scan every split of a shard folder against benchmarks (names, sets, and the tasks of eval
    `suites`); write clean shards + provenance unless `dry_run`."""
    from rufus_data.console import console, progress
    from rufus_data.shards import (
        atomic_output_dir,
        file_sha256,
        package_versions,
        split_files,
        write_manifest,
    )

    config = config or DecontamConfig()
    started = time.time()
    by_split = split_files(shards)
    files = [path for paths in by_split.values() for path in paths]
    if out is None and not dry_run:
        raise RufusError("decontam needs --out DIR (or --dry-run to only report)")
    if out is not None and Path(out).exists() and not overwrite and not dry_run:
        raise RufusError(f"output folder {out} already exists: pass --overwrite to replace it, or choose another --out")
    for path in files:
        try:
            pq.read_schema(path)
        except (pa.ArrowException, OSError) as err:
            raise RufusError(f"{path} is not a readable parquet shard ({type(err).__name__}: {err}); nothing was written") from None
    loaded = load_benchmarks(against, benchmarks_file, skip_missing, list(suites))
    asked = [*against, *(f"suite:{s}" for s in suites)]
    if not loaded.items:
        raise RufusError(f"no eval items loaded for {' '.join(asked)} (missing: {', '.join(loaded.missing) or 'none'})")
    index = _cached_index(loaded, config)
    tasks, rows_in = _plan(files, config.batch_rows)
    # auto: one process per CPU, but small inputs stay in-process (forking costs more than it saves)
    workers = config.workers or (min(os.cpu_count() or 1, len(tasks)) if rows_in >= AUTO_PROCESSES_FROM_ROWS else 1)
    with progress("rows") as bar:
        job = bar.add_task("decontam", total=rows_in) if show_progress else None

        def done(task: Task) -> None:
            if job is not None:
                bar.advance(job, task.rows)

        if config.engine == "ray":
            cands = _scan_ray(tasks, index, done)
        else:
            cands = _scan_local(tasks, index, workers, done)
    hits, boiler = finalize(cands, index, rows_in)
    hits, splits = _with_splits(hits, by_split, tasks)
    flagged = set(hits.column("row").to_pylist())
    result = DecontamResult(hits, rows_in, rows_in - len(flagged), flagged, loaded.missing, loaded.sources, boiler,
                            {"eval_items": len(loaded.items), "boilerplate_eval_grams": index.boilerplate_eval_grams,
                             "common_shingles": index.common_shingles, "indexed_grams": len(index.postings)},
                            0.0, not_decontaminable=loaded.not_decontaminable, splits=splits)
    if not dry_run:
        with atomic_output_dir(out, overwrite) as tmp:
            (tmp / "data").mkdir()
            first = 0
            for path in files:
                table = pq.read_table(path)
                keep = np.ones(table.num_rows, dtype=bool)
                drop = [r - first for r in flagged if first <= r < first + table.num_rows]
                keep[drop] = False
                pq.write_table(table.filter(pa.array(keep)), tmp / "data" / path.name, compression="zstd", write_statistics=True)
                first += table.num_rows
            pq.write_table(hits, tmp / "contaminated.parquet")
            result.seconds = time.time() - started
            (tmp / "report.md").write_text(render_report(result, asked, config))
            write_manifest(tmp, {
                "command": "rufus-data decontam", "against": against, "against_suites": list(suites),
                "not_decontaminable": loaded.not_decontaminable, "splits": splits, "config": config.model_dump(),
                "config_hash": _hash(config.model_dump()),
                "inputs": {str(p): file_sha256(p) for p in files}, "benchmarks": loaded.sources,
                "skipped_benchmarks": loaded.missing, "rows_in": rows_in, "rows_out": result.rows_out,
                "rows_dropped": len(flagged), "hits": hits.num_rows, "index": result.index_stats,
                "boilerplate_train_grams": boiler[:100], "seconds": round(result.seconds, 2),
                "versions": package_versions("datasketch", "pyarrow", "numpy"),
            })
        result.out = Path(out)
    result.seconds = time.time() - started
    if show_progress:
        console.print(summary_table(result))
    return result


def _with_splits(hits: pa.Table, by_split: dict[str, list[Path]], tasks: list[Task]) -> tuple[pa.Table, dict]:
    """Name each hit's split (from its global row number) and count rows and flagged rows per split."""
    split_of = {str(path): split for split, paths in by_split.items() for path in paths}
    starts = np.asarray([t.first_row for t in tasks], dtype=np.int64)
    task_split = [split_of[t.path] for t in tasks]
    rows = hits.column("row").to_numpy()
    names = [task_split[i] for i in (np.searchsorted(starts, rows, side="right") - 1).tolist()]
    splits = {split: {"rows": 0, "flagged": 0} for split in by_split}
    for task in tasks:
        splits[split_of[task.path]]["rows"] += task.rows
    for _, name in set(zip(rows.tolist(), names)):  # rows, not hits: a row can hit several items
        splits[name]["flagged"] += 1
    return hits.append_column("split", pa.array(names, pa.string())), splits


AUTO_PROCESSES_FROM_ROWS = 20_000
_INDEX_CACHE: dict[str, EvalIndex] = {}
_RUN_ONLY = {"batch_rows", "workers", "engine"}  # settings that do not change the index


def _cached_index(loaded, config: DecontamConfig) -> EvalIndex:
    """The eval index is built once per process for the same benchmark files and settings."""
    key = _hash([sorted((k, v["fingerprint"], v.get("spec")) for k, v in loaded.sources.items()),
                 config.model_dump(exclude=_RUN_ONLY)])
    if key not in _INDEX_CACHE:
        if len(_INDEX_CACHE) >= 4:
            _INDEX_CACHE.pop(next(iter(_INDEX_CACHE)))
        _INDEX_CACHE[key] = build_index(loaded.items, config)
    index = _INDEX_CACHE[key]
    index.config = config
    return index


def _hash(obj) -> str:
    import hashlib

    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()[:16]


def source_benchmark_counts(result: DecontamResult) -> dict[tuple[str, str], set[int]]:
    counts: dict[tuple[str, str], set[int]] = defaultdict(set)
    for src, bench, row in zip(*(result.hits.column(c).to_pylist() for c in ("source", "benchmark", "row"))):
        counts[(src, bench)].add(row)
    return counts


def summary_table(result: DecontamResult):
    from rich.table import Table

    counts = source_benchmark_counts(result)
    benches = sorted({b for _, b in counts}) or ["-"]
    table = Table(title=f"decontam: {len(result.flagged_rows):,} of {result.rows_in:,} rows flagged "
                        f"({result.rows_in / max(result.seconds, 1e-9):,.0f} rows/s)")
    table.add_column("source")
    for b in benches:
        table.add_column(b, justify="right")
    for src in sorted({s for s, _ in counts}):
        table.add_row(src or "-", *(str(len(counts.get((src, b), ()))) for b in benches))
    return table


def render_report(result: DecontamResult, against: list[str], config: DecontamConfig) -> str:
    counts = source_benchmark_counts(result)
    benches = sorted({b for _, b in counts})
    methods = defaultdict(int)
    for m in result.hits.column("method").to_pylist():
        methods[m] += 1
    lines = [
        "# decontam report", "",
        (f"Checked {result.rows_in:,} rows against {', '.join(against)} "
         f"({result.index_stats['eval_items']:,} eval items from {', '.join(result.benchmarks)})."),
        (f"**{len(result.flagged_rows):,} rows flagged and dropped** ({len(result.flagged_rows) / max(1, result.rows_in):.2%}); "
         f"{result.rows_out:,} rows kept. Hits: {result.hits.num_rows:,} "
         f"(exact {methods['exact']:,}, minhash {methods['minhash']:,})."), "",
        (f"Settings: n={config.ngram}-word grams, MinHash over {config.shingle}-word shingles with {config.num_perm} "
         f"permutations, containment >= {config.containment}, windows of {config.window} shingles."), "",
        "## Rows flagged, by source x benchmark", "",
    ]
    if benches:
        lines += ["| source | " + " | ".join(benches) + " |", "| --- |" + " ---: |" * len(benches)]
        for src in sorted({s for s, _ in counts}):
            lines.append(f"| {src or '-'} | " + " | ".join(str(len(counts.get((src, b), ()))) for b in benches) + " |")
    else:
        lines.append("No hits.")
    if len(result.splits) > 1:
        lines += ["", "## Rows flagged, by split", "", "| split | rows | flagged |", "| --- | ---: | ---: |"]
        lines += [f"| {split} | {n['rows']:,} | {n['flagged']:,} |" for split, n in result.splits.items()]
    if result.missing:
        lines += ["", "## Benchmarks skipped (--skip-missing)", ""]
        lines += [f"- `{name}`: {why}" for name, why in result.missing.items()]
    if result.not_decontaminable:
        lines += ["", "## Suite tasks not checked (no problem text in the registry)", ""]
        lines += [f"- `{task}`: {why}" for task, why in result.not_decontaminable.items()]
    if result.boilerplate_train_grams:
        lines += ["", "## n-grams ignored as training-side boilerplate", ""]
        lines += [f"- `{g}`" for g in result.boilerplate_train_grams[:30]]
    lines += ["", "## First hits", "", "| row id | benchmark | item | method | containment | field | matched |",
              "| --- | --- | --- | --- | ---: | --- | --- |"]
    for hit in result.hits.slice(0, 30).to_pylist():
        grams = "; ".join(hit["matched_ngrams"][:2]).replace("|", "\\|")
        lines.append(f"| {hit['row_id']} | {hit['benchmark']} | {hit['eval_item_id']} | {hit['method']} | "
                     f"{hit['containment']:.2f} | {', '.join(hit['fields'][:2])} | {grams[:120]} |")
    lines += ["", ("contaminated.parquet holds every hit (one row per training row x eval item); "
                   "docs/decontam.md explains the columns and the thresholds."), ""]
    return "\n".join(lines)
