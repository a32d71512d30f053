"""`rufus-data mix --dry-run`: what a mix would write, with the run's own counting and selection
(selection.py): the catalog is read and every row token-counted, as the run does, but no
canonical row is kept, no output folder or lock is made, and nothing is written. filter and
pairs plan a catalog input with it rather than mixing it to disk."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rufus_data.base.console import print_result
from rufus_data.base.yaml_config import settings_model
from rufus_data.folders.output_step import check_output
from rufus_data.mix.config import MixConfig, default_out
from rufus_data.mix.selection import (
    count_and_select,
    open_sources,
    print_sources,
    read_catalog,
    share_notes,
    source_summaries,
)
from rufus_data.sources.catalog import MixtureCatalog


@dataclass
class MixPlan:
    """What a mix of `catalog` would write to `out`: each source's figures (selection.source_summaries)."""

    catalog: MixtureCatalog
    catalog_path: Path | None  # None: given from Python
    out: Path
    sources: list[dict]
    budget: float

    @property
    def rows_train(self) -> int:
        return sum(s["rows_out"] for s in self.sources)

    @property
    def rows_holdout(self) -> int:
        return sum(s["rows_holdout"] for s in self.sources)


def mix_plan(inputs: str | Path | dict | MixtureCatalog, out: str | Path | None = None,
             settings: MixConfig | dict | str | Path | None = None, *, overwrite: bool = False,
             show_progress: bool = False, check_out: bool = True) -> MixPlan:
    """The plan of `mix` with the same arguments: count and select as the run would; `check_out`:
    refuse an output the run would refuse (an existing folder without `overwrite`), as the run does
    before its tokenizer loads."""
    config = settings_model(MixConfig, settings)
    read = read_catalog(inputs)  # the rewards are checked here too
    catalog = read.catalog
    out = Path(out) if out is not None else default_out(read.name)
    if check_out:
        check_output("rufus-data mix", out, overwrite=overwrite)
    opened, counter = open_sources(read)
    counted, selections = count_and_select(catalog, opened, counter, holdout=config.holdout,
                                           on_bad_row=config.on_bad_row or catalog.on_bad_row, parts_dir=None,
                                           show_progress=show_progress)
    return MixPlan(catalog, read.path, out, source_summaries(catalog, counted, selections),
                   sum(s.target_tokens for s in selections))


def print_mix_plan(plan: MixPlan) -> None:
    """The plan on stdout: the per-source table the run prints when it is done, and what is next."""
    catalog = plan.catalog
    basis = catalog.basis if catalog.kind == "sft" else "total"
    print_result(f"mix plan {catalog.name} ({catalog.kind}): {plan.rows_train:,} rows (+{plan.rows_holdout:,} held out), "
                 f"budget {plan.budget:,.0f} {basis} tokens, tokenizer {catalog.tokenizer}, seed {catalog.seed}",
                 highlight=False)
    print_sources(None, plan.sources, share_notes(plan.sources), basis)
    print_result(f"dry run: nothing written (drop --dry-run to write {plan.out})", highlight=False)
