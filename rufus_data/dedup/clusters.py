"""Stage 4 of dedup, clusters: the verified pairs are joined into clusters by union-find, and
one row of each cluster is kept: a train row before a holdout row, then, among the rows with the
fewest shingles of their own (give or take one: the content that the others frame with a preamble, a
suffix, a system prompt or an ID), the first in input order. Every other row of the cluster is checked against the kept row itself,
and dropped only if it is a duplicate of it (a chain A~B~C with C no duplicate of A does not
drop C); the rows that are not go round again among themselves. A dropped row carries the
measure's value with its kept row and their Jaccard. A mix's repeats (rows that share an
`origin_id`) were never compared: each follows its first copy, kept or dropped."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rufus_data.dedup.config import DedupConfig
from rufus_data.dedup.verify import ShingleStore, scores
from rufus_data.similarity.ngram_hash import distinct, sorted_member


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


KEEPER_SLACK = 1  # own shingles above the fewest of a cluster that a kept row may have


@dataclass
class Drops:
    """Dropped rows (sorted) with the kept row of each, the measure's value and their Jaccard."""

    rows: np.ndarray
    kept: np.ndarray
    jaccard: np.ndarray
    value: np.ndarray

    @classmethod
    def none(cls) -> Drops:
        return cls(np.empty(0, np.int64), np.empty(0, np.int64), np.empty(0, np.float64), np.empty(0, np.float64))


def _packed(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a.astype(np.uint64) << np.uint64(32)) | b.astype(np.uint64)


def _keepers(nodes: np.ndarray, roots: np.ndarray, holdout: np.ndarray, own: np.ndarray) -> np.ndarray:
    """The kept row of each node's cluster (`roots`, ascending): its first row in input order among
    the train rows (holdout rows where it has none) with the fewest own shingles, give or take
    KEEPER_SLACK (a swapped word may move the count by one; an ID adds two, a preamble eight)."""
    order = np.lexsort((own, holdout, roots))
    first = np.ones(len(order), bool)
    first[1:] = roots[order][1:] != roots[order][:-1]
    cluster = np.searchsorted(roots[order][first], roots)
    best_holdout, fewest = holdout[order][first][cluster], own[order][first][cluster]
    eligible = (holdout == best_holdout) & (own <= fewest + KEEPER_SLACK)
    order = np.lexsort((nodes, ~eligible, roots))
    first = np.ones(len(order), bool)
    first[1:] = roots[order][1:] != roots[order][:-1]
    return nodes[order][first][cluster]


def minhash_drops(a: np.ndarray, b: np.ndarray, value: np.ndarray, jaccard: np.ndarray, store: ShingleStore,
                  holdout_of, config: DedupConfig) -> Drops:
    """The rows the verified pairs (a, b, value, Jaccard) drop, each checked against its cluster's
    kept row (`holdout_of(rows)`: whether each row is in the holdout split)."""
    verified = _packed(a, b)
    order = np.argsort(verified)
    verified, value, jaccard = verified[order], value[order], jaccard[order]
    dropped: list[Drops] = []
    while len(a):
        nodes, roots = cluster_roots(a, b)
        keepers = _keepers(nodes, roots, holdout_of(nodes), store.own_sizes(nodes))
        members, kept = nodes[nodes != keepers], keepers[nodes != keepers]
        lo, hi = np.minimum(members, kept), np.maximum(members, kept)
        wanted = _packed(lo, hi)
        pos = np.minimum(np.searchsorted(verified, wanted), len(verified) - 1)
        known = verified[pos] == wanted
        found_value, found_jaccard = value[pos], jaccard[pos]
        duplicate = known.copy()
        if (~known).any():  # not a candidate pair: measured now
            fresh = scores(store, lo[~known], hi[~known], config)
            found_value[~known], found_jaccard[~known] = fresh.value, fresh.jaccard
            duplicate[~known] = fresh.duplicates(config)
        dropped.append(Drops(members[duplicate], kept[duplicate], found_jaccard[duplicate], found_value[duplicate]))
        settled = distinct(np.concatenate((keepers, members[duplicate])))
        left = ~(sorted_member(a, settled) | sorted_member(b, settled))  # the rest go round again
        a, b = a[left], b[left]
    rows = np.concatenate([d.rows for d in dropped] + [np.empty(0, np.int64)])
    order = np.argsort(rows)
    return Drops(rows[order], *(np.concatenate([getattr(d, f) for d in dropped] + [np.empty(0, dtype)])[order]
                                for f, dtype in (("kept", np.int64), ("jaccard", np.float64), ("value", np.float64))))


def with_repeats(drops: Drops, repeat_rows: np.ndarray, first_rows: np.ndarray) -> Drops:
    """`drops` and the repeats of every dropped row, as their first copy (same kept row, value and Jaccard)."""
    pos = np.minimum(np.searchsorted(drops.rows, first_rows), max(len(drops.rows) - 1, 0))
    follow = (drops.rows[pos] == first_rows) if len(drops.rows) else np.zeros(len(first_rows), bool)
    rows = np.concatenate((drops.rows, repeat_rows[follow]))
    order = np.argsort(rows, kind="stable")
    return Drops(rows[order], *(np.concatenate((getattr(drops, f), getattr(drops, f)[pos[follow]]))[order]
                                for f in ("kept", "jaccard", "value")))
