"""What decontam checks against and every knob of how, in one model, DecontamConfig: the stages
read their settings from here, `--config FILE.yaml` and the options on top of it fill it,
`decontam()` takes it as its settings, and the manifest records it. Beside it, DecontamCommand:
what one `rufus-data decontam` reads and writes. Both are the command's options
(rufus_data/base/cli_options.py), so this module loads nothing heavy."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field

from rufus_data.base.catalog_files import docs_page
from rufus_data.base.cli_options import DRY_RUN_HELP, REPORT_ONLY_HELP, Flag
from rufus_data.base.errors import RufusError
from rufus_data.base.yaml_config import StrictModel
from rufus_data.similarity import DEFAULT_EMBEDDER


class DecontamConfig(StrictModel):
    """What decontam checks against and every knob of how; the defaults are the measured ones in
    docs/decontam.md."""

    against: Annotated[list[str], Flag(metavar="NAME")] = Field(
        default_factory=list, description="a benchmark or set of the registry, or an eval suite (catalogs/suites/NAME.yaml "
        "or a path: its tasks' benchmarks), repeatable")
    against_suite: Annotated[list[str], Flag(metavar="SUITE")] = Field(
        default_factory=list, description="an eval suite only (as --against SUITE), repeatable")
    benchmarks: Path | None = Field(None, description="registry file (default catalogs/benchmarks.yaml)")
    skip_missing: bool = Field(False, description="go on without benchmarks that cannot be loaded (the report lists them)")
    ngram: int = Field(8, ge=1, description="word n-gram length of the exact stage")
    shingle: int = Field(2, ge=1, description="word shingle length of the MinHash stage")
    num_perm: int = Field(64, ge=16, description="MinHash permutations")
    lsh_threshold: float = Field(0.2, gt=0, le=1, description="Jaccard threshold of the LSH candidate index")
    containment: float = Field(0.5, gt=0, le=1, description="min containment of an eval item in a field (stage 2)")
    containment_alone: float = Field(0.6, gt=0, le=1, description="stage 2: from this containment an item is a hit "
                                     "whatever else its field holds")
    min_field_share: float = Field(0.3, ge=0, le=1, description="stage 2, below containment_alone: the share of the field "
                                   "(a window at most) the item's shingles must make up")
    window: int = Field(96, ge=8, description="training fields longer than this (shingles) are cut into windows")
    min_item_shingles: int = Field(8, ge=1, description="eval items with fewer shingles skip stage 2")
    min_shared_shingles: int = Field(6, ge=1, description="a MinHash hit also needs this many shared shingles")
    min_answer_words: int = Field(8, ge=1, description="an answer this long counts on its own; shorter only with its problem")
    answer_min_share: float = Field(0.5, gt=0, le=1, description="an answer hit alone needs this share of its n-grams")
    min_matched_grams: int = Field(3, ge=1, description="an answer hit alone needs at least this many n-grams")
    min_matched_words: int = Field(16, ge=1, description="exact problem hits: words of the item its matched n-grams cover "
                                   "(all of a shorter item's)")
    max_items_per_gram: int = Field(4, ge=1, description="an n-gram in more eval items (families) than this is boilerplate")
    max_row_fraction: float = Field(0.01, gt=0, le=1, description="an n-gram matched in more than this share of rows is boilerplate")
    min_rows_boilerplate: int = Field(50, ge=1, description="...but never below this many rows")
    short_numbers: bool = Field(True, description="flag short items found with other numbers (method `numbers`)")
    short_item_words: int = Field(12, ge=2, description="items shorter than this get the numbers stage's second look")
    max_shingle_item_fraction: float = Field(0.02, gt=0, le=1, description="shingles in more eval items than this share are ignored")
    # stage 3, semantic (off by default; docs/decontam.md says when to switch it on and what it costs)
    semantic: bool = Field(False, description="run the semantic stage: embedding retrieval + evidence (+ judge)")
    semantic_model: str = Field(DEFAULT_EMBEDDER, description="`wordllama` (ships in its wheel) or a sentence-transformers model")
    semantic_top_k: int = Field(3, ge=1, description="nearest eval items checked per field or window")
    semantic_min_cosine: float = Field(0.7, ge=-1, le=1, description="pairs below this cosine are not considered")
    semantic_min_quantities: int = Field(2, ge=1, description="items with this many quantities are judged by them")
    semantic_quantity_share: float = Field(0.75, ge=0, le=1, description="rarity-weighted share of the item's quantities kept")
    semantic_word_share: float = Field(0.3, ge=0, le=1, description="rarity-weighted share of the item's content words kept")
    semantic_few_quantities_cosine: float = Field(0.8, ge=-1, le=1, description="cosine needed by items with fewer quantities")
    semantic_few_quantities_word_share: float = Field(0.5, ge=0, le=1, description="word share needed by items with fewer quantities")
    semantic_min_words: int = Field(8, ge=1, description="shorter fields are left to the exact stage (a short item's copy)")
    semantic_window: int = Field(128, ge=8, description="fields longer than this many words are embedded in windows")
    semantic_clustered_from: int = Field(20_000, ge=1, description="eval items from which the search is clustered (approximate)")
    semantic_batch_spans: int = Field(4096, ge=1, description="fields/windows embedded and searched at once")
    judge_url: str | None = Field(None, description="OpenAI-compatible server of an LLM judge for semantic pairs (off: None)")
    judge_model: str | None = Field(None, description="the judge's model (default: the server's first)")
    judge_min_cosine: float = Field(0.75, ge=-1, le=1, description="the judge also reads pairs the rule refused from this cosine")
    batch_rows: int = Field(2000, ge=1, description="training rows scanned per task")
    workers: int = Field(0, ge=0, description="local processes; 0 = one per CPU (in-process below 20k rows)")
    engine: Literal["local", "ray"] = Field("local", description="local (multiprocessing) or ray (Ray Data)")
    seed: int = Field(1, description="seed of the MinHash permutations")


def check_judge(config: DecontamConfig) -> None:
    """The judge reads the semantic stage's pairs: a judge without that stage is refused."""
    if config.judge_url and not config.semantic:
        raise RufusError("--judge-url judges the pairs of the semantic stage: add --semantic (or `semantic: true` "
                         "in --config), or drop --judge-url")


class DecontamCommand(StrictModel):
    """What one `rufus-data decontam` reads and writes (its DecontamConfig apart: what it checks against, and how)."""

    shards: Annotated[Path, Flag(argument=True)] = Field(
        description="shard folder to check (written by mix, filter, ...)")
    out: Path | None = Field(None, description="output folder, required unless --report-only: clean shards, "
                             "contaminated.parquet, hits.html, report.md")
    config: Path | None = Field(None, description=f"YAML of the settings below ({docs_page('decontam.md')}); the options given "
                                "on the command line override its keys")
    report_only: bool = Field(False, description=REPORT_ONLY_HELP)
    overwrite: bool = Field(False, description="replace an existing output folder")
    dry_run: bool = Field(False, description=f"{DRY_RUN_HELP}: the shard folder's splits and rows, each benchmark "
                          "with its items (missing and not decontaminable ones named), the stages and their thresholds, "
                          "the engine and workers; nothing scanned")


# settings that do not change the eval index (what it is checked against reaches its key as the items)
RUN_ONLY = frozenset({"short_numbers", "batch_rows", "workers", "engine", "semantic_batch_spans", "judge_url", "judge_model",
                      "against", "against_suite", "benchmarks", "skip_missing"})
# settings only the semantic stage reads: the exact and MinHash indexes do not depend on them
SEMANTIC_ONLY = frozenset(name for name in DecontamConfig.model_fields if name.startswith(("semantic", "judge")))
