"""Every knob of decontam in one model: the stages read their settings from here, the CLI and
`--config FILE.yaml` fill it, and the manifest records it."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class DecontamConfig(BaseModel):
    """Every knob of decontam; the defaults are the measured ones in docs/decontam.md."""

    model_config = ConfigDict(extra="forbid")

    ngram: int = Field(8, ge=1, description="word n-gram length of the exact stage")
    shingle: int = Field(2, ge=1, description="word shingle length of the MinHash stage")
    num_perm: int = Field(64, ge=16, description="MinHash permutations")
    lsh_threshold: float = Field(0.2, gt=0, le=1, description="Jaccard threshold of the LSH candidate index")
    containment: float = Field(0.5, gt=0, le=1, description="min containment of an eval item in a field (stage 2)")
    window: int = Field(96, ge=8, description="training fields longer than this (shingles) are cut into windows")
    min_item_shingles: int = Field(8, ge=1, description="eval items with fewer shingles skip stage 2")
    min_shared_shingles: int = Field(6, ge=1, description="a MinHash hit also needs this many shared shingles")
    min_answer_words: int = Field(8, ge=1, description="an answer this long counts on its own; shorter only with its problem")
    answer_min_share: float = Field(0.5, gt=0, le=1, description="an answer hit alone needs this share of its n-grams")
    min_matched_grams: int = Field(3, ge=1, description="exact hits need this many n-grams (all of a shorter item's)")
    max_items_per_gram: int = Field(4, ge=1, description="an n-gram in more eval items (families) than this is boilerplate")
    max_row_fraction: float = Field(0.01, gt=0, le=1, description="an n-gram matched in more than this share of rows is boilerplate")
    min_rows_boilerplate: int = Field(50, ge=1, description="...but never below this many rows")
    max_shingle_item_fraction: float = Field(0.02, gt=0, le=1, description="shingles in more eval items than this share are ignored")
    batch_rows: int = Field(2000, ge=1)
    workers: int = Field(0, ge=0, description="processes; 0 = one per CPU (in-process below 20k rows)")
    engine: Literal["local", "ray"] = "local"
    seed: int = 1


RUN_ONLY = frozenset({"batch_rows", "workers", "engine"})  # settings that do not change the eval index
