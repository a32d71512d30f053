"""`rufus-data decontam --dry-run`: what a run would read and check, and how, with nothing
scanned, indexed or written. The shard folder is read as far as its parquet footers (splits,
files, rows); the benchmarks as far as their items (the plan says how many each has, which
cannot be loaded and which have nothing to check); the settings as resolved (a --config file
under the options); and every refusal the run makes before it scans is made here too."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from rufus_data.base.console import print_result, print_rows
from rufus_data.base.engines import auto_workers, describe_engine, plan_row_groups
from rufus_data.base.errors import RufusError
from rufus_data.base.yaml_config import settings_model
from rufus_data.benchmarks import load_benchmarks
from rufus_data.decontam.config import DecontamConfig, check_judge
from rufus_data.folders.output_step import check_output
from rufus_data.folders.shards import shard_row_counts, split_files
from rufus_data.sources.inputs import shard_folder


@dataclass
class DecontamPlan:
    """What a decontam run would read (`splits`: split -> (files, rows)) and check (`benchmarks`:
    name -> items), what it would skip, and how."""

    shards: Path
    out: Path | None
    asked: list[str]
    splits: dict[str, tuple[int, int]]
    benchmarks: dict[str, int]
    missing: dict[str, str] = field(default_factory=dict)
    not_decontaminable: dict[str, str] = field(default_factory=dict)
    config: DecontamConfig = field(default_factory=DecontamConfig)
    workers: int = 1

    @property
    def rows(self) -> int:
        return sum(rows for _, rows in self.splits.values())


def decontam_plan(inputs: str | Path, out: str | Path | None = None,
                  settings: DecontamConfig | dict | str | Path | None = None, *, overwrite: bool = False,
                  report_only: bool = False) -> DecontamPlan:
    """The plan of `decontam` with the same arguments. Benchmarks that cannot be loaded are
    listed; without `skip_missing` the run would stop at them, and so does the plan, once printed
    (print_decontam_plan)."""
    config = settings_model(DecontamConfig, settings)
    check_judge(config)
    shards = shard_folder(inputs, "rufus-data decontam")
    by_split = split_files(shards)
    out = None if out is None else Path(out)
    check_output("rufus-data decontam", out, overwrite=overwrite, report_only=report_only)
    splits = {split: (len(files), sum(shard_row_counts(files))) for split, files in by_split.items()}
    loaded = load_benchmarks(config.against, config.benchmarks, True, config.against_suite)
    asked = [*config.against, *(f"suite:{s}" for s in config.against_suite)]
    if not loaded.items:
        raise RufusError(f"no eval items loaded for {' '.join(asked)} (missing: {', '.join(loaded.missing) or 'none'})")
    items = Counter(item.benchmark for item in loaded.items)
    tasks, rows = plan_row_groups([path for files in by_split.values() for path in files], config.batch_rows)
    return DecontamPlan(shards, out, asked, splits, {name: items[name] for name in loaded.sources}, loaded.missing,
                        loaded.not_decontaminable, config, auto_workers(config.workers, rows, len(tasks)))


def print_decontam_plan(plan: DecontamPlan) -> None:
    """The plan on stdout; then, when benchmarks are missing and the run would stop at them, the refusal."""
    config = plan.config
    print_result(f"decontam plan: reads {plan.shards}, {plan.rows:,} rows in every split", highlight=False)
    print_rows(["split", "files", "rows"], [(split, f"{files:,}", f"{rows:,}") for split, (files, rows) in plan.splits.items()])
    print_result(f"checks against {' '.join(plan.asked)}: {sum(plan.benchmarks.values()):,} eval items", highlight=False)
    missing = "skipped (--skip-missing)" if config.skip_missing else "cannot be loaded: the run stops (--skip-missing goes on)"
    rows = [(name, f"{count:,}", "checked") for name, count in plan.benchmarks.items()]
    rows += [(name, "-", missing) for name in plan.missing]
    rows += [(name, "-", f"not decontaminable: {why}") for name, why in plan.not_decontaminable.items()]
    print_rows(["benchmark", "items", "status"], rows)
    judge = f"; LLM judge {config.judge_url} ({config.judge_model or 'its first model'})" if config.judge_url else ""
    stages = [
        ("exact", "yes", (f"{config.ngram}-word n-grams covering at least {config.min_matched_words} words of an item; "
                          f"answers of {config.min_answer_words}+ words count alone")),
        ("minhash", "yes", (f"{config.shingle}-word shingles, {config.num_perm} permutations, LSH at Jaccard "
                            f"{config.lsh_threshold}, containment >= {config.containment}")),
        ("numbers", "yes" if config.short_numbers else "no (short_numbers: false)",
         f"items under {config.short_item_words} words with their digits masked"),
        ("semantic", "yes" if config.semantic else "no (--semantic)",
         f"{config.semantic_model}, top {config.semantic_top_k}, cosine >= {config.semantic_min_cosine}{judge}"),
    ]
    print_rows(["stage", "runs", "settings"], stages)
    print_result(f"engine: {describe_engine(config.engine, config.workers, plan.workers)}; {config.batch_rows:,} rows per task",
                 highlight=False)
    target = f"write {plan.out}" if plan.out else "print the summary (--report-only)"
    print_result(f"dry run: nothing scanned or written (drop --dry-run to {target})", highlight=False)
    if plan.missing and not config.skip_missing:
        why = next(iter(plan.missing.values()))
        raise RufusError(f"the run would stop: {len(plan.missing)} benchmark(s) cannot be loaded here "
                         f"({', '.join(plan.missing)}); the first: {why}")

