"""Top-k cosine search of many query vectors against a fixed set of unit vectors.

Small sets (every eval suite Rufus ships: a few thousand items) are searched exactly with one
matrix product per batch. Large sets use an inverted-file index: the vectors are grouped by
spherical k-means, each query is compared with the group centres and then only with the
members of its `probe` nearest groups (about sqrt(n) groups, so a query touches a few percent of
the vectors). tests/test_decontam_semantic.py checks its recall against the exact search."""

from __future__ import annotations

import numpy as np


def top_k(scores: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Column indices and values of each row's k largest scores, best first."""
    k = min(k, scores.shape[1])
    if k == 0:
        empty = np.empty((scores.shape[0], 0))
        return empty.astype(np.int64), empty.astype(scores.dtype)
    part = np.argpartition(-scores, k - 1, axis=1)[:, :k] if k < scores.shape[1] else np.tile(
        np.arange(scores.shape[1]), (scores.shape[0], 1))
    values = np.take_along_axis(scores, part, axis=1)
    order = np.argsort(-values, axis=1, kind="stable")
    return np.take_along_axis(part, order, axis=1), np.take_along_axis(values, order, axis=1)


def top_k_above(scores: np.ndarray, k: int, floor: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(row, column, score) of each row's k largest scores that reach `floor`: only the few
    scores above the floor are sorted, not every row."""
    some = np.flatnonzero(scores.max(axis=1) >= floor)  # most rows have nothing near: skip them whole
    rows, cols = np.nonzero(scores[some] >= floor)
    rows = some[rows]
    values = scores[rows, cols]
    order = np.lexsort((-values, rows))
    rows, cols, values = rows[order], cols[order], values[order]
    starts = np.searchsorted(rows, rows, side="left")
    keep = np.arange(len(rows)) - starts < k
    return rows[keep], cols[keep], values[keep]


class ExactSearch:
    """Every query against every vector (a BLAS matrix product)."""

    def __init__(self, vectors: np.ndarray):
        self.vectors = np.ascontiguousarray(vectors, dtype=np.float32)
        self.columns = np.ascontiguousarray(self.vectors.T)  # stored transposed: the product runs ~20% faster

    def search(self, queries: np.ndarray, k: int, floor: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(query, vector, cosine) of each query's k nearest vectors at or above `floor`."""
        return top_k_above(queries @ self.columns, k, floor)


class ClusteredSearch:
    """An inverted-file index over spherical k-means groups (approximate; see the module docstring)."""

    def __init__(self, vectors: np.ndarray, groups: int | None = None, probe: int | None = None,
                 seed: int = 1, iterations: int = 8):
        vectors = np.ascontiguousarray(vectors, dtype=np.float32)
        n = len(vectors)
        groups = groups or max(1, int(np.sqrt(n)))
        self.probe = probe or max(1, min(groups, int(np.ceil(groups / 16))))
        rng = np.random.default_rng(seed)
        centres = vectors[rng.choice(n, size=groups, replace=False)].copy()
        for _ in range(iterations):
            assign = np.argmax(vectors @ centres.T, axis=1)
            sums = np.zeros_like(centres)
            np.add.at(sums, assign, vectors)
            empty = np.bincount(assign, minlength=groups) == 0
            sums[empty] = vectors[rng.choice(n, size=int(empty.sum()), replace=False)]
            centres = sums / np.maximum(np.linalg.norm(sums, axis=1, keepdims=True), 1e-12)
        assign = np.argmax(vectors @ centres.T, axis=1)
        self.order = np.argsort(assign, kind="stable")  # member positions, group by group
        self.starts = np.searchsorted(assign[self.order], np.arange(groups + 1))
        self.members = vectors[self.order]
        self.centres = centres.astype(np.float32)

    def search(self, queries: np.ndarray, k: int, floor: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """As ExactSearch.search, over the members of each query's nearest groups."""
        n = len(queries)
        best = np.full((n, k), -np.inf, dtype=np.float32)
        best_at = np.full((n, k), -1, dtype=np.int64)
        probes, _ = top_k(queries @ self.centres.T, self.probe)
        for group in np.unique(probes):
            lo, hi = self.starts[group], self.starts[group + 1]
            if lo == hi:
                continue
            asking = np.flatnonzero((probes == group).any(axis=1))
            scores = queries[asking] @ self.members[lo:hi].T
            merged = np.concatenate((best[asking], scores), axis=1)
            where = np.concatenate((best_at[asking], np.broadcast_to(self.order[lo:hi], scores.shape)), axis=1)
            cols, values = top_k(merged, k)
            best[asking] = values
            best_at[asking] = np.take_along_axis(where, cols, axis=1)
        rows, cols = np.nonzero(best >= floor)
        return rows, best_at[rows, cols], best[rows, cols]


def vector_search(vectors: np.ndarray, clustered_from: int):
    """Exact search below `clustered_from` vectors, the clustered index from there on."""
    return ExactSearch(vectors) if len(vectors) < clustered_from else ClusteredSearch(vectors)
