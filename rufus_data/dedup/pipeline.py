"""The MinHash stages of dedup over a shard folder, each a set of tasks run by the shared
engines (in-process, a local process pool, or Ray) and each task's output a file of the work
folder, so a killed run resumes at the first unfinished task:

    1. sketch   per row group: band keys, shingle-set keys, origin keys, field keys (signatures.py)
    2. group    per partition of each kind of key: repeats, exact copies, candidate pairs, the
                scaffold fields (candidates.py)
    3. verify   the candidate rows' shingles, then per partition of pairs: the measure (verify.py)
    4. clusters union-find over the verified pairs, each row checked against the row its
                cluster keeps, in this process (clusters.py)

What this process holds grows with the rows only by a few bytes a row (flags, and the arrays of
the dropped rows and verified pairs); everything else is bounded by a batch or a partition."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from rufus_data.base.console import console, progress
from rufus_data.base.engines import RowGroupTask, TaskWorker, run_tasks
from rufus_data.dedup.candidates import GroupPlan, GroupWorker, group_file, pairs_file
from rufus_data.dedup.clusters import Drops, minhash_drops, with_repeats
from rufus_data.dedup.config import LSH_WEIGHTS, DedupConfig
from rufus_data.dedup.shuffle import PAIRS, partitions_for, read_partition
from rufus_data.dedup.signatures import SketchPlan, SketchWorker, sketch_file
from rufus_data.dedup.verify import (
    EDGES,
    ShingleStore,
    ShingleWorker,
    VerifyPlan,
    VerifyWorker,
    edges_file,
    shingle_files,
)
from rufus_data.dedup.work import load_arrays, write_atomic
from rufus_data.similarity.minhash_lsh import band_params


@dataclass
class MinHashOutcome:
    drops: Drops  # the rows MinHash drops, repeats of dropped rows included
    repeats: tuple[np.ndarray, np.ndarray]  # (repeat row, its first copy), by repeat row
    has_words: np.ndarray  # bool per row: rows without words are never compared
    train_tokens: dict[str, int] = field(default_factory=dict)  # per source, before dedup
    token_column_seen: bool = False
    candidate_rows: int = 0  # rows LSH put beside another (verified next)
    verified_pairs: int = 0  # pairs of them that met the measure


class MinHashStages:
    """Runs stages 1-4 for one work folder."""

    def __init__(self, config: DedupConfig, tasks: list[RowGroupTask], rows: int, folder: Path,
                 train_paths: frozenset[str], token_column: str, workers: int, show_progress: bool):
        self.config, self.tasks, self.rows, self.folder = config, tasks, rows, folder
        self.workers, self.show_progress = workers, show_progress
        bands, _ = band_params(config.band_threshold, config.num_perm, LSH_WEIGHTS)
        self.parts = {"bands": partitions_for(rows * bands), "sets": partitions_for(rows), "origins": partitions_for(rows),
                      "fields": partitions_for(rows * 3)}
        self.pair_parts = self.parts["bands"]
        self.sketch = SketchPlan(folder, self.parts, train_paths, token_column)

    def run(self) -> MinHashOutcome:
        sketched = sum(sketch_file(self.folder, t, "meta").exists() for t in self.tasks)
        if sketched:
            console.print(f"dedup: resuming the work of an earlier run in {self.folder} "
                          f"({sketched} of {len(self.tasks)} row groups were sketched)", highlight=False)
        self._stage("sketch", self.tasks, SketchWorker(self.config, self.sketch),
                    lambda t: sketch_file(self.folder, t, "meta"), lambda t: t.rows, unit="rows")
        metas = [load_arrays(sketch_file(self.folder, t, "meta")) for t in self.tasks]
        has_words = np.concatenate([m["has_words"] for m in metas]) if metas else np.zeros(0, bool)
        tokens: dict[str, int] = {}
        for meta in metas:
            for source, count in zip(meta["sources"].tolist(), meta["tokens"].tolist()):
                tokens[source] = tokens.get(source, 0) + count
        seen = any(bool(m["column_seen"]) for m in metas)
        del metas

        repeat_rows, repeat_first = self._group("origins", None)
        skip = np.zeros(self.rows, bool)
        skip[repeat_rows] = True
        repeats_mask = self._save_mask("repeats", skip) if len(repeat_rows) else None
        copies, _ = self._group("sets", repeats_mask)
        skip[copies] = True
        skip_mask = self._save_mask("skip", skip) if skip.any() else None
        self._group("bands", skip_mask)
        self._group("fields", skip_mask)
        del skip, copies
        scaffold = self._scaffold_keys()

        candidates = self._save_mask("candidates", self._candidate_rows())
        wanted = np.load(candidates, mmap_mode="r")
        starts = np.asarray([t.first_row for t in self.tasks] + [self.rows], dtype=np.int64)
        with_candidates = [t for i, t in enumerate(self.tasks) if wanted[starts[i] : starts[i + 1]].any()]
        candidate_rows = int(np.count_nonzero(wanted))
        del wanted
        self._stage("shingles", with_candidates, ShingleWorker(self.config, self.folder, candidates, scaffold),
                    lambda t: shingle_files(self.folder, t.first_row)[1], lambda t: t.rows, unit="rows")
        plan = VerifyPlan(self.folder, self._pair_files(), self.pair_parts, starts[:-1], self.config)
        self._stage("verify", range(self.pair_parts), VerifyWorker(plan), lambda p: edges_file(self.folder, p))
        edges = read_partition([edges_file(self.folder, p) for p in range(self.pair_parts)], EDGES, 0, 1)
        holdout_task = np.asarray([t.path not in self.sketch.train_paths for t in self.tasks])

        def holdout_of(rows: np.ndarray) -> np.ndarray:
            return holdout_task[np.searchsorted(starts, rows, side="right") - 1]

        drops = minhash_drops(edges["a"], edges["b"], edges["value"], edges["jaccard"],
                              ShingleStore(self.folder, starts[:-1]), holdout_of, self.config)
        return MinHashOutcome(with_repeats(drops, repeat_rows, repeat_first), (repeat_rows, repeat_first), has_words,
                              tokens, seen, candidate_rows, len(edges["a"]))

    def _scaffold_keys(self) -> Path:
        """The fields held by so many rows that they are scaffold, sorted, saved for the spill."""
        found = [load_arrays(group_file(self.folder, "fields", p))["keys"] for p in range(self.parts["fields"])]
        path = self.folder / "masks" / "scaffold.npy"

        def write(tmp: Path) -> None:
            with open(tmp, "wb") as fh:
                np.save(fh, np.sort(np.concatenate(found + [np.empty(0, np.uint64)])))

        write_atomic(path, write)
        return path

    def _group(self, kind: str, skip_mask: Path | None) -> tuple[np.ndarray, np.ndarray]:
        """Stage 2 for one kind of key; for origins and sets: (follower rows, their first rows), by row."""
        inputs = tuple(sketch_file(self.folder, t, kind) for t in self.tasks)
        least = max(self.config.scaffold_min_rows, int(np.ceil(self.config.scaffold_share * self.rows)))
        worker = GroupWorker(GroupPlan(self.folder, kind, inputs, self.parts[kind], self.pair_parts, skip_mask, least))
        self._stage(f"group {kind}", range(self.parts[kind]), worker, worker.done_file)
        if kind in ("bands", "fields"):
            return np.empty(0, np.int64), np.empty(0, np.int64)
        found = [load_arrays(group_file(self.folder, kind, p)) for p in range(self.parts[kind])]
        rows = np.concatenate([f["rows"] for f in found] + [np.empty(0, np.int64)])
        first = np.concatenate([f["first"] for f in found] + [np.empty(0, np.int64)])
        order = np.argsort(rows)
        return rows[order], first[order]

    def _pair_files(self) -> tuple[Path, ...]:
        return tuple(pairs_file(self.folder, kind, p) for kind in ("sets", "bands", "fields") for p in range(self.parts[kind]))

    def _candidate_rows(self) -> np.ndarray:
        """Whether each row is in some candidate pair (read one partition of the pairs at a time)."""
        wanted = np.zeros(self.rows, bool)
        for part in range(self.pair_parts):
            pairs = read_partition(list(self._pair_files()), PAIRS, part, self.pair_parts)
            wanted[pairs["a"]] = True
            wanted[pairs["b"]] = True
        return wanted

    def _save_mask(self, name: str, mask: np.ndarray) -> Path:
        path = self.folder / "masks" / f"{name}.npy"

        def write(tmp: Path) -> None:
            with open(tmp, "wb") as fh:
                np.save(fh, mask)

        write_atomic(path, write)
        return path

    def _stage(self, name: str, tasks: Sequence, worker: TaskWorker, done_file: Callable[[object], Path],
               size: Callable[[object], int] = lambda _: 1, unit: str = "parts") -> None:
        """Run the tasks whose output is not there yet (a killed run's finished tasks are kept)."""
        pending = [t for t in tasks if not done_file(t).exists()]
        with progress(unit) as bar:
            job = bar.add_task(f"dedup: {name}", total=sum(size(t) for t in tasks)) if self.show_progress else None
            if job is not None:
                bar.advance(job, sum(size(t) for t in tasks) - sum(size(t) for t in pending))

            def done(task, _result) -> None:
                if job is not None:
                    bar.advance(job, size(task))

            run_tasks(pending, worker, done, workers=self.workers, engine=self.config.engine)
