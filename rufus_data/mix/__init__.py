"""`rufus-data mix`: a token-balanced mixture of a catalog's sources, as parquet shards with a
manifest and a report (docs/data.md).

    config.py           MixConfig, a run's settings beside the catalog, and MixCommand (loads nothing heavy)
    selection.py        passes 1 and 2: count every row, choose each source's rows by token share
    shuffled_shards.py  pass 3: the chosen rows as shuffled shards, in bounded memory
    run.py              mix(catalog, out, settings): the three passes into an output folder;
                        mix_inputs() for other commands
    plan.py             --dry-run: passes 1 and 2 only, printed, nothing written

The names below are imported when first used (lazy_exports.py): `rufus-data` reads config.py at
start, and this file must not load arrow or a tokenizer for it."""

from __future__ import annotations

from rufus_data.base.lazy_exports import lazy_exports

__all__ = ["MixCommand", "MixConfig", "MixPlan", "MixedInput", "SourceCounts", "mix", "mix_inputs", "mix_plan",
           "select_rows"]

__getattr__ = lazy_exports(__name__, {
    "MixCommand": "config", "MixConfig": "config", "MixPlan": "plan", "mix_plan": "plan", "MixedInput": "run",
    "mix": "run", "mix_inputs": "run", "SourceCounts": "selection", "select_rows": "selection",
})
