"""Stage 4 of dedup, clusters: the verified pairs are joined into clusters by union-find, and
the first row of each cluster (input order) is kept; every other row of it is dropped, with
the Jaccard of its shingle set and the kept row's. A mix's repeats (rows that share an
`origin_id`) were never compared: each follows its first copy, kept or dropped."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rufus_data.dedup.verify import ShingleStore, jaccard
from rufus_data.similarity.ngram_hash import distinct


def cluster_roots(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(every row in a pair, the first row of its cluster), by union-find over numpy arrays:
    each round hooks every cluster's root under the smallest root it shares a pair with, then
    compresses every path to its root, until no pair joins two clusters."""
    nodes = distinct(np.concatenate((a, b)))
    ia, ib = np.searchsorted(nodes, a), np.searchsorted(nodes, b)
    parent = np.arange(len(nodes))
    while True:
        ra, rb = parent[ia], parent[ib]
        joins = ra != rb
        if not joins.any():
            return nodes, nodes[parent]
        np.minimum.at(parent, np.maximum(ra, rb)[joins], np.minimum(ra, rb)[joins])  # a parent is never later
        while True:
            grand = parent[parent]
            if np.array_equal(grand, parent):
                break
            parent = grand


@dataclass
class Drops:
    """Dropped rows (sorted) with the kept row of each and their Jaccard."""

    rows: np.ndarray
    kept: np.ndarray
    jaccard: np.ndarray

    @classmethod
    def none(cls) -> Drops:
        return cls(np.empty(0, np.int64), np.empty(0, np.int64), np.empty(0, np.float64))


def minhash_drops(a: np.ndarray, b: np.ndarray, score: np.ndarray, store: ShingleStore) -> Drops:
    """The rows the verified pairs (a, b, Jaccard) drop. A row's Jaccard with its kept row is its
    pair's where they were a pair, else measured now (a chain: A~B and B~C put C with A)."""
    if not len(a):
        return Drops.none()
    nodes, roots = cluster_roots(a, b)
    dropped = nodes != roots
    rows, kept = nodes[dropped], roots[dropped]
    verified = (a.astype(np.uint64) << np.uint64(32)) | b.astype(np.uint64)
    order = np.argsort(verified)
    wanted = (kept.astype(np.uint64) << np.uint64(32)) | rows.astype(np.uint64)
    pos = np.minimum(np.searchsorted(verified[order], wanted), len(order) - 1)
    found = verified[order][pos] == wanted
    scores = np.empty(len(rows), np.float64)
    scores[found] = score[order][pos[found]]
    scores[~found] = jaccard(store, kept[~found], rows[~found])
    return Drops(rows, kept, scores)


def with_repeats(drops: Drops, repeat_rows: np.ndarray, first_rows: np.ndarray) -> Drops:
    """`drops` and the repeats of every dropped row, as their first copy (same kept row, same Jaccard)."""
    pos = np.minimum(np.searchsorted(drops.rows, first_rows), max(len(drops.rows) - 1, 0))
    follow = (drops.rows[pos] == first_rows) if len(drops.rows) else np.zeros(len(first_rows), bool)
    rows = np.concatenate((drops.rows, repeat_rows[follow]))
    order = np.argsort(rows, kind="stable")
    return Drops(rows[order], np.concatenate((drops.kept, drops.kept[pos[follow]]))[order],
                 np.concatenate((drops.jaccard, drops.jaccard[pos[follow]]))[order])
