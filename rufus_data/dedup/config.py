"""Every knob of dedup in one model, DedupConfig: the stages read their settings from here,
`--config FILE.yaml` and the options on top of it fill it, and the manifest records it. Beside
it, DedupCommand: what one `rufus-data dedup` reads and writes. Both are the command's options
(rufus_data/base/cli_options.py), so this module loads nothing heavy."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field

from rufus_data.base.catalog_files import docs_page
from rufus_data.base.cli_options import DRY_RUN_HELP, REPORT_ONLY_HELP, Flag
from rufus_data.base.yaml_config import StrictModel
from rufus_data.similarity import DEFAULT_EMBEDDER


class DedupConfig(StrictModel):
    """Every knob of dedup (settable with `rufus-data dedup --config FILE.yaml`)."""

    measure: Literal["containment", "jaccard"] = Field(
        "containment", description="containment: of the row with less content of its own in the other; jaccard: symmetric")
    threshold: float = Field(0.8, gt=0, le=1, description="the measure's value from which two rows are duplicates")
    numbers_must_match: bool = Field(True, description="the rows agree on the numbers where both have numbers in one context "
                                     "(two words each side); a row's frame (an id, a list number, a system prompt) does not count")
    scaffold_min_words: int = Field(16, ge=1, description="a field (whole message) of this many words ...")
    scaffold_min_rows: int = Field(20, ge=2, description="... held by this many rows ...")
    scaffold_share: float = Field(0.0005, ge=0, le=1, description="... and by this share of the rows: not a row's own content")
    field_containment: float = Field(0.5, ge=0, le=1, description="containment: each own field of the row must be found at this")
    min_own_shingles: int = Field(5, ge=1, description="rows with fewer shingles of their own are compared by Jaccard of them")
    lsh_threshold: float | None = Field(None, gt=0, le=1, description="Jaccard the LSH bands aim at; None: the measure's default")
    shingle: int = Field(3, ge=1, description="word shingle length")
    num_perm: int = Field(128, ge=16, description="MinHash permutations")
    batch_rows: int = Field(5000, ge=1, description="rows read and sketched at once")
    seed: int = Field(1, description="seed of the MinHash permutations")
    workers: int = Field(0, ge=0, description="local processes; 0 = one per CPU (in-process below 20k rows)")
    engine: Literal["local", "ray"] = Field("local", description="local (multiprocessing) or ray (Ray Data)")
    # stage 2, semantic (off by default; rufus_data/dedup/semantic.py, measured in docs/decontam.md)
    semantic: bool = Field(False, description="also drop rows that restate an earlier row in other words")
    semantic_model: str = Field(DEFAULT_EMBEDDER, description="`wordllama` (ships in its wheel) or a sentence-transformers model")
    semantic_top_k: int = Field(5, ge=1, description="nearest earlier rows checked per row")
    semantic_min_cosine: float = Field(0.75, ge=-1, le=1, description="pairs below this cosine are not considered")
    semantic_word_share: float = Field(0.2, ge=0, le=1, description="Jaccard of content stems, rows decided by their quantities")
    semantic_few_quantities_cosine: float = Field(0.95, ge=-1, le=1, description="cosine needed by rows with too few quantities")
    semantic_few_quantities_word_share: float = Field(0.6, ge=0, le=1, description="Jaccard needed by rows with too few quantities")
    semantic_clustered_from: int = Field(20_000, ge=1, description="rows from which the search is clustered (approximate)")

    @property
    def band_threshold(self) -> float:
        """The Jaccard the LSH bands aim at, below the threshold so that pairs just above it are not
        missed (the verification decides). A row under a new preamble is contained in its copy but
        its Jaccard with it is lower, the shorter the row the lower: containment bands lower."""
        if self.lsh_threshold is not None:
            return self.lsh_threshold
        return CONTAINMENT_BANDS_AT if self.measure == "containment" else max(0.1, self.threshold - 0.15)


class DedupCommand(StrictModel):
    """What one `rufus-data dedup` reads and writes (its DedupConfig apart)."""

    shards: Annotated[Path, Flag(argument=True)] = Field(description="shard folder to deduplicate")
    out: Path | None = Field(None, description="output folder, required unless --report-only: clean shards, "
                             "clusters.parquet, report.md")
    config: Path | None = Field(None, description=f"YAML of the settings below ({docs_page('decontam.md')}); the options given "
                                "on the command line override its keys")
    report_only: bool = Field(False, description=REPORT_ONLY_HELP)
    overwrite: bool = Field(False, description="replace an existing output folder")
    dry_run: bool = Field(False, description=f"{DRY_RUN_HELP}: the shard folder's splits and rows, the stages and "
                          "their thresholds, the engine and workers; nothing hashed")


CONTAINMENT_BANDS_AT = 0.5  # measured: docs/decontam.md ("Which rows are duplicates")
LSH_WEIGHTS = (0.3, 0.7)  # false positives, false negatives: recall first, every candidate is re-checked
# settings that do not change the result (a killed run resumes under other values of these)
RUN_ONLY = frozenset({"workers", "engine", "batch_rows"})
