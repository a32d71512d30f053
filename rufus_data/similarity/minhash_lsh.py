"""MinHash signatures over word shingles and LSH banding, for decontam's MinHash stage and dedup:
datasketch's `MinHash.bulk`, a batch hasher bit-identical to it, band keys, and a vectorised
band index (decontam's eval side; dedup groups its band keys by sorting instead)."""

from __future__ import annotations

import numpy as np
from datasketch import MinHash
from datasketch.lsh import _optimal_param
from datasketch.minhash import _fmix

from rufus_data.similarity.ngram_hash import sorted_member


def minhash_kwargs(num_perm: int, seed: int) -> dict:
    """One place for the MinHash parameters, so eval, training and dedup signatures are comparable.
    The inputs are already 32-bit shingle hashes, so the hash function is the identity."""
    return {"num_perm": num_perm, "seed": seed, "hashfunc": int}


def signatures(shingle_sets: list[np.ndarray], num_perm: int, seed: int) -> list[MinHash]:
    """MinHash of each shingle set, computed with datasketch's `MinHash.bulk`."""
    return MinHash.bulk([s.tolist() for s in shingle_sets], **minhash_kwargs(num_perm, seed))


class BatchMinHasher:
    """MinHash signatures for a whole batch of shingle sets in a few numpy operations.

    It applies datasketch's own "affine32" scheme (the MurmurHash3 pre-mix, then `a * h + b`
    mod 2^32 with the permutations of `MinHash(num_perm, seed)`), so every row equals what
    `MinHash.bulk` returns for the same shingles (tests/test_decontam.py checks it) -- without
    a Python call per row, which is what makes decontam faster than a plain exact pass."""

    def __init__(self, num_perm: int, seed: int):
        template = MinHash(**minhash_kwargs(num_perm, seed))
        self.num_perm, self.seed = num_perm, seed
        self._a, self._b = (np.asarray(p, dtype=np.uint32) for p in template.permutations)

    def segments(self, shingles: np.ndarray, starts: np.ndarray, chunk: int = 8192) -> np.ndarray:
        """Signature of each segment [starts[i], starts[i+1]) of `shingles` (uint32); segments must be non-empty.

        Works through cache-sized chunks of whole segments in a (num_perm x chunk) buffer."""
        out = np.empty((self.num_perm, len(starts)), dtype=np.uint32)
        if not len(starts):
            return out.T
        mixed = _fmix(shingles.astype(np.uint32, copy=False), 32)
        bounds = np.append(starts, len(shingles)).astype(np.int64)
        longest = int(np.diff(bounds).max())
        buf = np.empty((self.num_perm, max(chunk, longest)), dtype=np.uint32)
        a, b = self._a[:, None], self._b[:, None]
        first = 0
        while first < len(starts):
            last = int(np.searchsorted(bounds, bounds[first] + buf.shape[1], side="right")) - 1
            last = min(max(last, first + 1), len(starts))
            lo, hi = int(bounds[first]), int(bounds[last])
            view = buf[:, : hi - lo]
            with np.errstate(over="ignore"):
                np.multiply(a, mixed[None, lo:hi], out=view)
                np.add(view, b, out=view)
            out[:, first:last] = np.minimum.reduceat(view, bounds[first:last] - lo, axis=1)
            first = last
        return out.T


_MIX = np.uint64(0x9E3779B97F4A7C15)


def band_params(threshold: float, num_perm: int, weights: tuple[float, float]) -> tuple[int, int]:
    """(b bands, r rows per band) for a Jaccard threshold, chosen by datasketch's own optimiser
    (`weights`: false positives, false negatives), as its `MinHashLSH` chooses them."""
    return _optimal_param(threshold, num_perm, *weights)


def band_keys(sigs: np.ndarray, b: int, r: int) -> np.ndarray:
    """(n, b) uint64 keys of (n, num_perm) signatures: each band's r values folded together with
    the band number, so two rows share a key when they agree on all r values of that band."""
    n = len(sigs)
    bands = sigs[:, : b * r].astype(np.uint64).reshape(n, b, r)
    with np.errstate(over="ignore"):
        acc = np.broadcast_to(np.arange(1, b + 1, dtype=np.uint64), (n, b)).copy()
        for j in range(r):
            acc = acc * _MIX + bands[:, :, j]
    return acc


class BandIndex:
    """LSH banding over MinHash signatures: b bands of r rows, (b, r) chosen by datasketch's own
    optimiser for a Jaccard threshold with false negatives weighted heavier (every candidate is
    re-checked exactly afterwards, so a false positive costs little). Lookups are vectorised:
    all windows of a batch are banded and matched with one `np.isin`."""

    _LOW = np.uint64((1 << 22) - 1)

    def __init__(self, threshold: float, num_perm: int, weights: tuple[float, float] = (0.2, 0.8)):
        self.b, self.r = band_params(threshold, num_perm, weights)
        self.keys = np.empty(0, dtype=np.uint64)
        self.bitmap = np.zeros(1 << 22, dtype=bool)  # first filter on the low bits of band keys
        self.starts = np.zeros(1, dtype=np.int64)  # keys[i]'s indexed keys are owners[starts[i]:starts[i+1]]
        self.owners = np.empty(0, dtype=np.int64)  # (flat arrays: built, pickled and read back in milliseconds)

    def band_keys(self, sigs: np.ndarray) -> np.ndarray:
        return band_keys(sigs, self.b, self.r)

    def build(self, sigs: np.ndarray, keys: list[int]) -> None:
        bands = self.band_keys(sigs).ravel()
        owners = np.repeat(np.asarray(keys, dtype=np.int64), self.b)
        order = np.lexsort((owners, bands))
        bands, self.owners = bands[order], owners[order]
        first = np.flatnonzero(np.concatenate(([True], bands[1:] != bands[:-1]))) if len(bands) else np.empty(0, np.int64)
        self.keys = bands[first]
        self.starts = np.append(first, len(bands))
        self.bitmap[(self.keys & self._LOW).astype(np.int64)] = True

    def candidates(self, sigs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The distinct (segment index, indexed key) pairs that share at least one band, as two arrays."""
        if not len(sigs) or not len(self.keys):
            return np.empty(0, np.int64), np.empty(0, np.int64)
        bands = self.band_keys(sigs)
        seg, band = np.nonzero(self.bitmap[(bands & self._LOW).astype(np.int64)])
        values = bands[seg, band]
        found = sorted_member(values, self.keys)
        seg, where = seg[found], np.searchsorted(self.keys, values[found])
        lo, counts = self.starts[where], np.diff(self.starts)[where]
        entry = np.arange(counts.sum()) - np.repeat(np.cumsum(counts) - counts, counts) + np.repeat(lo, counts)
        pairs = (np.repeat(seg, counts).astype(np.uint64) << np.uint64(32)) | self.owners[entry].astype(np.uint64)
        pairs.sort()
        if len(pairs):
            pairs = pairs[np.concatenate(([True], pairs[1:] != pairs[:-1]))]
        return (pairs >> np.uint64(32)).astype(np.int64), (pairs & np.uint64(0xFFFFFFFF)).astype(np.int64)

