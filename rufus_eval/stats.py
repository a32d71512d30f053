"""The statistics of an evaluation a user acts on: pass@k from k samples, the standard error of a
mean over documents, and the paired difference of two runs on the same documents.

Paired, because two checkpoints scored on the same documents share each document's difficulty:
the standard error of the per-document differences is far smaller than the two runs' standard
errors combined, so a real gain of one or two points shows as one. One definition each: the
lm-eval metrics (metrics.py), `rufus-eval compare` (compare.py) and the checkpoint evaluation's
curve (checkpoint_eval/curve.py) use these."""

from __future__ import annotations

import math
from collections.abc import Sequence


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples of which c passed (Chen et al., 2021): the chance that k
    samples drawn without replacement from the n hold at least one that passed,
    1 - C(n-c, k) / C(n, k)."""
    if not 0 <= c <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n passing samples, got n={n}, c={c}")
    if not 1 <= k <= n:
        raise ValueError(f"pass@{k} needs 1 <= k <= n={n} samples")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def mean_and_se(values: Sequence[float]) -> tuple[float, float]:
    """(mean, standard error of the mean: the sample SD with ddof 1 over sqrt(n)); the standard
    error is NaN for a single value (nothing to estimate the spread from)."""
    n = len(values)
    if n == 0:
        raise ValueError("the mean of no values is undefined")
    mean = math.fsum(values) / n
    if n == 1:
        return mean, math.nan
    variance = math.fsum((v - mean) ** 2 for v in values) / (n - 1)
    return mean, math.sqrt(variance / n)


def paired_difference(a: Sequence[float], b: Sequence[float]) -> tuple[float, float]:
    """(mean of b[i] - a[i], its standard error) over per-document scores of two runs on the same
    documents, in the same order: positive when run b scores higher."""
    if len(a) != len(b):
        raise ValueError(f"paired scores come in pairs: {len(a)} documents against {len(b)}")
    return mean_and_se([y - x for x, y in zip(a, b)])


def beyond_noise(delta: float, se: float, sigmas: float = 2.0) -> bool | None:
    """Whether a difference is more than `sigmas` standard errors from zero; None when its
    standard error is unknown (one document)."""
    if math.isnan(se):
        return None
    return abs(delta) > sigmas * se


def pass_at_ks(samples: int) -> list[int]:
    """The k reported for `samples` samples per document: 1, 2, 4, ... up to it, and it."""
    if samples < 1:
        return []
    ks = [2**i for i in range(samples.bit_length()) if 2**i <= samples]
    return ks if ks[-1] == samples else [*ks, samples]
