"""Every knob of dedup in one model: the stages read their settings from here, the CLI and
`--config FILE.yaml` fill it, and the manifest records it."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from rufus_data.similarity.embedding import DEFAULT_MODEL
from rufus_data.yaml_config import StrictModel


class DedupConfig(StrictModel):
    """Every knob of dedup (settable with `rufus-data dedup --config FILE.yaml`)."""

    threshold: float = Field(0.8, gt=0, le=1, description="exact Jaccard of shingle sets to call two rows duplicates")
    shingle: int = Field(3, ge=1, description="word shingle length")
    num_perm: int = Field(128, ge=16)
    batch_rows: int = Field(5000, ge=1, description="rows read and sketched at once")
    seed: int = 1
    workers: int = Field(0, ge=0, description="processes; 0 = one per CPU (in-process below 20k rows)")
    engine: Literal["local", "ray"] = "local"
    # stage 2, semantic (off by default; rufus_data/dedup/semantic.py, measured in docs/decontam.md)
    semantic: bool = Field(False, description="also drop rows that restate an earlier row in other words")
    semantic_model: str = Field(DEFAULT_MODEL, description="`wordllama` (ships in its wheel) or a sentence-transformers model")
    semantic_top_k: int = Field(5, ge=1, description="nearest earlier rows checked per row")
    semantic_min_cosine: float = Field(0.75, ge=-1, le=1, description="pairs below this cosine are not considered")
    semantic_word_share: float = Field(0.2, ge=0, le=1, description="Jaccard of content stems, rows decided by their quantities")
    semantic_few_quantities_cosine: float = Field(0.95, ge=-1, le=1, description="cosine needed by rows with too few quantities")
    semantic_few_quantities_word_share: float = Field(0.6, ge=0, le=1, description="Jaccard needed by rows with too few quantities")
    semantic_clustered_from: int = Field(20_000, ge=1, description="rows from which the search is clustered (approximate)")

    @property
    def lsh_threshold(self) -> float:
        """The LSH looks for candidates below the threshold, so pairs just above it are not
        missed; the exact Jaccard decides."""
        return max(0.1, self.threshold - 0.15)


LSH_WEIGHTS = (0.3, 0.7)  # false positives, false negatives: recall first, every candidate is re-checked
# settings that do not change the result (a killed run resumes under other values of these)
RUN_ONLY = frozenset({"workers", "engine", "batch_rows"})
