"""The eval side of decontam: every stage's index over the eval items. A command reads the exact
and MinHash indexes from `$RUFUS_CACHE` when an earlier one built them for the same eval items
and settings (the semantic stage keeps its own eval side there too); a process keeps the last few
indexes in memory; the scan workers get the index by fork or pickle."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from importlib.metadata import version

from rufus_data.base.paths import cached_pickle
from rufus_data.benchmarks import EvalItem, LoadedBenchmarks
from rufus_data.decontam import exact_stage, minhash_stage, numbers_stage, texts
from rufus_data.decontam.config import RUN_ONLY, SEMANTIC_ONLY, DecontamConfig
from rufus_data.decontam.exact_stage import ExactIndex, Postings, build_exact_index
from rufus_data.decontam.minhash_stage import MinHashIndex, build_minhash_index
from rufus_data.decontam.numbers_stage import NumbersIndex, build_numbers_index
from rufus_data.decontam.semantic_stage import SemanticIndex, build_semantic_index
from rufus_data.decontam.texts import EvalTexts
from rufus_data.similarity import minhash_lsh, ngram_hash, textnorm
from rufus_data.similarity.minhash_lsh import BandIndex, BatchMinHasher
from rufus_data.similarity.ngram_hash import TokenHasher

CACHED_INDEXES = 4
# what the cached exact and MinHash indexes depend on besides the items and settings: the code
# that computes them, and the libraries whose output they hold (token ids are polars string
# hashes, MinHash permutations datasketch's, words pyarrow's normalisation)
_CACHED_CODE = (texts, exact_stage, minhash_stage, numbers_stage, minhash_lsh, ngram_hash, textnorm)
_CACHED_TYPES = (ExactIndex, Postings, MinHashIndex, BandIndex, BatchMinHasher, NumbersIndex)  # what the entry holds
_CACHED_LIBRARIES = ("polars", "pyarrow", "numpy", "datasketch")


@dataclass
class EvalIndex:
    """Everything a worker needs about the eval side: one index per stage."""

    config: DecontamConfig
    items: list[EvalItem]
    exact: ExactIndex
    minhash: MinHashIndex
    numbers: NumbersIndex
    semantic: SemanticIndex | None = None  # only with `semantic: true`

    def stats(self) -> dict:
        return {"eval_items": len(self.items), "boilerplate_eval_grams": self.exact.boilerplate_grams,
                "common_shingles": self.minhash.common_shingles, "indexed_grams": len(self.exact.postings),
                "short_items": self.numbers.items,
                **(self.semantic.stats() if self.semantic else {})}


def build_eval_index(items: list[EvalItem], config: DecontamConfig, cache: bool = False) -> EvalIndex:
    """Tokenise every eval text once (the normalisation of the training side), then build each
    stage's index; with `cache`, the exact and MinHash indexes come from `$RUFUS_CACHE` when an
    earlier command built them (keyed by the items' texts, the settings they read, the code and
    library versions) and are kept there otherwise."""
    def build() -> tuple[ExactIndex, MinHashIndex, NumbersIndex]:
        eval_texts = EvalTexts.of(items, TokenHasher())
        return build_exact_index(eval_texts, config), build_minhash_index(eval_texts, config), build_numbers_index(eval_texts, config)

    if cache:
        key = [[(it.benchmark, it.item_id, it.problems, it.answers, it.group) for it in items],
               config.model_dump(exclude=RUN_ONLY | SEMANTIC_ONLY),
               {name: version(name) for name in _CACHED_LIBRARIES}]
        exact, minhash, numbers = cached_pickle("decontam/ngrams", key, _CACHED_CODE, build, types=_CACHED_TYPES)
    else:
        exact, minhash, numbers = build()
    semantic = build_semantic_index(items, config) if config.semantic else None
    return EvalIndex(config, items, exact, minhash, numbers, semantic)


_CACHE: dict[str, EvalIndex] = {}


def cached_eval_index(loaded: LoadedBenchmarks, config: DecontamConfig) -> EvalIndex:
    """The index of these benchmark files under these settings: kept in the process after first
    use (a test session or a notebook scans many folders against the same benchmarks), read from
    `$RUFUS_CACHE` by a new command (build_eval_index)."""
    key = json.dumps([sorted((k, v["fingerprint"], v.get("spec")) for k, v in loaded.sources.items()),
                      config.model_dump(exclude=RUN_ONLY)], sort_keys=True, default=str)
    key = hashlib.sha256(key.encode()).hexdigest()
    if key not in _CACHE:
        if len(_CACHE) >= CACHED_INDEXES:
            _CACHE.pop(next(iter(_CACHE)))
        _CACHE[key] = build_eval_index(loaded.items, config, cache=True)
    index = _CACHE[key]
    index.config = config  # the run-only settings may differ
    return index
