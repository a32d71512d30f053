"""Stage 2 of decontam, near duplicates: MinHash over word shingles. Eval items are sketched
with datasketch's `MinHash.bulk` and their signatures banded into a `BandIndex` (LSH); each
training field, cut into windows about an eval item long, is sketched with `BatchMinHasher`
(bit-identical to it) and queried, and every candidate is re-checked exactly: the
*containment* of the eval item's shingle set in the field's shingle set must reach the
threshold. Shingles common across eval items ("how many", "of the") carry no identity and are
left out of every item's set."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np

from rufus_data.decontam.candidates import Candidates
from rufus_data.decontam.config import DecontamConfig
from rufus_data.decontam.texts import PROBLEM, EvalTexts, FieldBatch
from rufus_data.minhash_lsh import BandIndex, BatchMinHasher, signatures
from rufus_data.ngram_hash import batch_gram_hashes, fold32, shingle32


@dataclass
class MinHashIndex:
    """The eval side of the MinHash stage."""

    item_shingles: list[np.ndarray]  # per item: sorted distinct shingles minus common ones
    lsh: BandIndex  # the MinHash signatures of eval items with enough shingles, banded
    hasher: BatchMinHasher
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


def build_minhash_index(texts: EvalTexts, config: DecontamConfig) -> MinHashIndex:
    shingles: dict[int, list[np.ndarray]] = defaultdict(list)
    for t, (i, kind) in enumerate(texts.owners):
        ids = texts.text_ids(t)
        if kind == PROBLEM and len(ids):
            shingles[i].append(shingle32(ids, config.shingle))
    shingle_sets = [np.unique(np.concatenate(shingles[i])) if shingles[i] else np.empty(0, np.uint32)
                    for i in range(len(texts.items))]
    common = np.empty(0, np.uint32)
    if shingle_sets:
        # counted per family: one family's shared wording is its identity, not boilerplate
        per_family = np.concatenate([shingle_sets[m[0]] if len(m) == 1 else np.unique(np.concatenate([shingle_sets[i] for i in m]))
                                     for m in texts.family_members()])
        values, counts = np.unique(per_family, return_counts=True)
        limit = max(2, int(config.max_shingle_item_fraction * texts.n_families))
        common = values[counts > limit].astype(np.uint32)
    item_shingles = [s[~np.isin(s, common)] for s in shingle_sets]
    lsh = BandIndex(config.lsh_threshold, config.num_perm)
    eligible = [i for i, s in enumerate(item_shingles) if len(s) >= config.min_item_shingles]
    if eligible:
        sketches = signatures([item_shingles[i] for i in eligible], config.num_perm, config.seed)
        lsh.build(np.stack([m.hashvalues for m in sketches]), eligible)
    return MinHashIndex(item_shingles, lsh, BatchMinHasher(config.num_perm, config.seed), len(common))


def scan_minhash(batch: FieldBatch, index: MinHashIndex, config: DecontamConfig, found: Candidates) -> None:
    """Fields are cut into chunks of window/2 shingles; a window is two neighbouring chunks, so
    an eval item about a window long always lies mostly inside one."""
    if not len(index.lsh.keys):
        return
    grams, owner = batch_gram_hashes(batch.ids, batch.offsets, config.shingle)
    if not len(grams):
        return
    shingles = fold32(grams)
    counts = np.bincount(owner, minlength=len(batch.offsets) - 1)
    keep_field = counts >= max(1, int(np.ceil(config.containment * config.min_item_shingles)))
    if not keep_field.any():
        return
    mask = keep_field[owner]
    shingles, owner = shingles[mask], owner[mask]
    fields = np.flatnonzero(keep_field)
    counts = counts[fields]
    field_start = np.concatenate(([0], np.cumsum(counts)[:-1]))
    stride = max(1, config.window // 2)
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
        if score >= config.containment and shared >= config.min_shared_shingles:
            t = int(fields[f])
            c = found.at(int(batch.row_of[t]), item)
            c.fields.add(batch.names[t])
            c.containment = max(c.containment, score)
