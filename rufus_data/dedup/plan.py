"""`rufus-data dedup --dry-run`: what a run would read and check, and how, with nothing hashed
or written. The shard folder is read as far as its parquet footers (splits, files, rows) and
its manifest (the column the share report counts); the settings as resolved (a --config file
under the options); and every refusal the run makes before it starts is made here too."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from rufus_data.base.console import print_result, print_rows
from rufus_data.base.engines import auto_workers, describe_engine, plan_row_groups
from rufus_data.base.yaml_config import settings_model
from rufus_data.dedup.config import DedupConfig
from rufus_data.dedup.run import token_column
from rufus_data.folders.output_step import check_output
from rufus_data.folders.shards import shard_row_counts, split_files
from rufus_data.sources.inputs import shard_folder


@dataclass
class DedupPlan:
    """What a dedup run would read (`splits`: split -> (files, rows)) and how it would compare rows."""

    shards: Path
    out: Path | None
    splits: dict[str, tuple[int, int]]
    share_column: str
    config: DedupConfig = field(default_factory=DedupConfig)
    workers: int = 1

    @property
    def rows(self) -> int:
        return sum(rows for _, rows in self.splits.values())


def dedup_plan(inputs: str | Path, out: str | Path | None = None, settings: DedupConfig | dict | str | Path | None = None,
               *, overwrite: bool = False, report_only: bool = False) -> DedupPlan:
    """The plan of `dedup` with the same arguments."""
    config = settings_model(DedupConfig, settings)
    shards = shard_folder(inputs, "rufus-data dedup")
    by_split = split_files(shards)
    out = None if out is None else Path(out)
    check_output("rufus-data dedup", out, overwrite=overwrite, report_only=report_only)
    splits = {split: (len(files), sum(shard_row_counts(files))) for split, files in by_split.items()}
    tasks, rows = plan_row_groups([path for files in by_split.values() for path in files], config.batch_rows)
    return DedupPlan(shards, out, splits, token_column(shards), config, auto_workers(config.workers, rows, len(tasks)))


def print_dedup_plan(plan: DedupPlan) -> None:
    """The plan on stdout."""
    config = plan.config
    print_result(f"dedup plan: reads {plan.shards}, {plan.rows:,} rows in every split (train first; the first row of "
                 "each cluster stays)", highlight=False)
    print_rows(["split", "files", "rows"], [(split, f"{files:,}", f"{rows:,}") for split, (files, rows) in plan.splits.items()])
    numbers = "; numbers must match" if config.numbers_must_match else ""
    stages = [
        ("minhash", "yes", (f"{config.measure} >= {config.threshold}{numbers}; {config.shingle}-word shingles, "
                            f"{config.num_perm} permutations, LSH bands at Jaccard {config.band_threshold:g}")),
        ("semantic", "yes" if config.semantic else "no (--semantic)",
         f"{config.semantic_model}, top {config.semantic_top_k}, cosine >= {config.semantic_min_cosine}"),
    ]
    print_rows(["stage", "runs", "settings"], stages)
    engine = describe_engine(config.engine, config.workers, plan.workers)
    print_result(f"engine: {engine}; {config.batch_rows:,} rows per task; token shares counted on {plan.share_column}",
                 highlight=False)
    target = f"write {plan.out}" if plan.out else "print the summary (--report-only)"
    print_result(f"dry run: nothing hashed or written (drop --dry-run to {target})", highlight=False)
