"""Stage 2 of decontam, near duplicates: MinHash over word shingles. Eval items and training
fields are sketched with `BatchMinHasher` (bit-identical to datasketch's `MinHash.bulk`); the
items' signatures are banded into a `BandIndex` (LSH); each training field, cut into windows
about an eval item long, is sketched and queried, and every candidate is re-checked exactly: the
*containment* of the eval item's shingle set in the field's shingle set must reach the
threshold. Shingles common across eval items ("how many", "of the") carry no identity and are
left out of every item's set."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rufus_data.decontam.candidates import Candidates
from rufus_data.decontam.config import DecontamConfig
from rufus_data.decontam.texts import PROBLEM, EvalTexts, FieldBatch
from rufus_data.similarity.minhash_lsh import BandIndex, BatchMinHasher
from rufus_data.similarity.ngram_hash import batch_gram_hashes, fold32, gram_hashes, sorted_member


@dataclass
class MinHashIndex:
    """The eval side of the MinHash stage."""

    shingles: np.ndarray  # each item's sorted distinct shingles minus common ones, item after item
    bounds: np.ndarray  # item i's are shingles[bounds[i]:bounds[i + 1]]
    lsh: BandIndex  # the MinHash signatures of eval items with enough shingles, banded
    hasher: BatchMinHasher
    common_shingles: int = 0


def build_minhash_index(texts: EvalTexts, config: DecontamConfig) -> MinHashIndex:
    """Vectorised over all eval texts at once: each item's distinct shingles (of all its
    problems; a problem shorter than a shingle is one shingle of all its words) minus the common
    ones, signed by `BatchMinHasher` (bit-identical to datasketch's `MinHash.bulk`) and banded."""
    k = config.shingle
    lengths = np.diff(texts.offsets)
    problem = np.asarray([kind == PROBLEM for _, kind in texts.owners], dtype=bool) & (lengths > 0)
    item_of = np.asarray([i for i, _ in texts.owners], dtype=np.int64)
    text_of = np.repeat(np.arange(len(lengths)), lengths)
    grams = gram_hashes(texts.ids, k)  # over the concatenation; grams that cross a text's end go
    owner = text_of[: len(grams)]
    keep = problem[owner] & (np.arange(len(grams)) + k <= texts.offsets[1:][owner])
    short = np.flatnonzero(problem & (lengths < k))
    short_grams = np.asarray([gram_hashes(texts.text_ids(t), int(lengths[t]))[0] for t in short.tolist()], dtype=np.uint64)
    items = item_of[np.concatenate((owner[keep], short))]
    shingles = fold32(np.concatenate((grams[keep], short_grams)))
    items, shingles = _distinct_pairs(items, shingles)
    # common shingles: in more than a share of the item families (one family's shared wording is its identity)
    _, per_family = _distinct_pairs(texts.family[items], shingles)
    per_family.sort()
    runs = np.flatnonzero(np.concatenate(([True], per_family[1:] != per_family[:-1], [True])))
    limit = max(2, int(config.max_shingle_item_fraction * texts.n_families))
    common = per_family[runs[:-1]][np.diff(runs) > limit]
    kept = ~sorted_member(shingles, common)
    items, shingles = items[kept], shingles[kept]
    counts = np.bincount(items, minlength=len(texts.items))
    bounds = np.concatenate(([0], np.cumsum(counts)))
    lsh = BandIndex(config.lsh_threshold, config.num_perm)
    hasher = BatchMinHasher(config.num_perm, config.seed)
    eligible = np.flatnonzero(counts >= config.min_item_shingles)
    if len(eligible):
        signed = np.isin(items, eligible)
        starts = np.concatenate(([0], np.cumsum(counts[eligible])[:-1]))
        lsh.build(hasher.segments(shingles[signed], starts), eligible.tolist())
    return MinHashIndex(shingles, bounds, lsh, hasher, len(common))


def _distinct_pairs(owners: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The distinct (owner, 32-bit value) pairs, sorted by owner then value."""
    pairs = (owners.astype(np.uint64) << np.uint64(32)) | values.astype(np.uint64)
    pairs.sort()
    if len(pairs):
        pairs = pairs[np.concatenate(([True], pairs[1:] != pairs[:-1]))]
    return (pairs >> np.uint64(32)).astype(np.int64), (pairs & np.uint64(0xFFFFFFFF)).astype(np.uint32)


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
    window, items = index.lsh.candidates(window_sigs)
    if not len(window):
        return
    # the containment of each candidate item in its field: every shingle of the item looked up
    # among the field's (one sorted array of (field, shingle) keys for the batch)
    pair_field, items = _distinct_pairs(window_field[window], items)
    items = items.astype(np.int64)
    sizes = index.bounds[items + 1] - index.bounds[items]
    pair_of = np.repeat(np.arange(len(items)), sizes)
    at = np.arange(len(pair_of)) - np.repeat(np.cumsum(sizes) - sizes, sizes) + np.repeat(index.bounds[items], sizes)
    wanted = (pair_field[pair_of].astype(np.uint64) << np.uint64(32)) | index.shingles[at].astype(np.uint64)
    shingle_field = np.repeat(np.arange(len(fields)), counts)
    needed = np.zeros(len(fields), dtype=bool)
    needed[pair_field] = True
    keep = needed[shingle_field]
    have = (shingle_field[keep].astype(np.uint64) << np.uint64(32)) | shingles[keep].astype(np.uint64)
    have.sort()
    shared = np.bincount(pair_of[sorted_member(wanted, have)], minlength=len(items))
    score = shared / sizes
    # below `containment_alone` the item must also make up `min_field_share` of its field (a window at
    # most): a short item's common shingles are found in a longer, different problem; a leak is most of its text
    share = shared / np.minimum(counts[pair_field], config.window)
    passed = ((score >= config.containment) & (shared >= config.min_shared_shingles)
              & ((score >= config.containment_alone) | (share >= config.min_field_share)))
    for p in np.flatnonzero(passed).tolist():
        t = int(fields[pair_field[p]])
        c = found.at(int(batch.row_of[t]), int(items[p]))
        c.fields.add(batch.names[t])
        c.containment = max(c.containment, float(score[p]))
