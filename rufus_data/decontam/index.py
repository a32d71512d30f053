"""The eval side of decontam: every stage's index over the eval items, built once per process for
the same benchmark files and settings, and pickled to the scan workers."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

from rufus_data.benchmarks import EvalItem, LoadedBenchmarks
from rufus_data.decontam.config import RUN_ONLY, DecontamConfig
from rufus_data.decontam.exact_stage import ExactIndex, build_exact_index
from rufus_data.decontam.minhash_stage import MinHashIndex, build_minhash_index
from rufus_data.decontam.semantic_stage import SemanticIndex, build_semantic_index
from rufus_data.decontam.texts import EvalTexts
from rufus_data.ngram_hash import TokenHasher

CACHED_INDEXES = 4


@dataclass
class EvalIndex:
    """Everything a worker needs about the eval side: one index per stage."""

    config: DecontamConfig
    items: list[EvalItem]
    exact: ExactIndex
    minhash: MinHashIndex
    semantic: SemanticIndex | None = None  # only with `semantic: true`

    def stats(self) -> dict:
        return {"eval_items": len(self.items), "boilerplate_eval_grams": self.exact.boilerplate_grams,
                "common_shingles": self.minhash.common_shingles, "indexed_grams": len(self.exact.postings),
                **(self.semantic.stats() if self.semantic else {})}


def build_eval_index(items: list[EvalItem], config: DecontamConfig) -> EvalIndex:
    """Tokenise every eval text once (the normalisation of the training side), then build each stage's index."""
    texts = EvalTexts.of(items, TokenHasher())
    semantic = build_semantic_index(items, config) if config.semantic else None
    return EvalIndex(config, items, build_exact_index(texts, config), build_minhash_index(texts, config), semantic)


_CACHE: dict[str, EvalIndex] = {}


def cached_eval_index(loaded: LoadedBenchmarks, config: DecontamConfig) -> EvalIndex:
    """The index of these benchmark files under these settings, built on first use in the process
    (a test session or a notebook scans many folders against the same benchmarks)."""
    key = json.dumps([sorted((k, v["fingerprint"], v.get("spec")) for k, v in loaded.sources.items()),
                      config.model_dump(exclude=RUN_ONLY)], sort_keys=True, default=str)
    key = hashlib.sha256(key.encode()).hexdigest()
    if key not in _CACHE:
        if len(_CACHE) >= CACHED_INDEXES:
            _CACHE.pop(next(iter(_CACHE)))
        _CACHE[key] = build_eval_index(loaded.items, config)
    index = _CACHE[key]
    index.config = config  # the run-only settings may differ
    return index
