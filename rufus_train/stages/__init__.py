"""The stage registry: name -> Stage (one-line description, config class, trainer hooks).

Every module in this package that defines `STAGE` (one Stage instance) or `STAGES` (a list) is
registered; adding a stage means adding a module, nothing else. What a stage is lives below
(rufus_train/stage_base.py), the GRPO machinery too (rufus_train/grpo/).

- sft.py: sft, sft_full, midtrain; distill.py: on-policy distillation.
- dpo.py, kto.py, orpo.py: offline preference optimisation; online_dpo.py: DPO on pairs the
  policy writes while it trains.
- GRPO: reasoning_rl.py, coding_rl.py, if_rl.py, rlhf.py (learned preferences), agents.py
  (general_agent, coding_agent, search_agent: GRPO with tools)."""

from __future__ import annotations

import difflib
import importlib
import pkgutil
from functools import cache

from rufus_data.base.errors import RufusError
from rufus_train.stage_base import Stage, StageContext

__all__ = ["Stage", "StageContext", "all_stages", "get_stage"]


@cache
def all_stages() -> dict[str, Stage]:
    found: dict[str, Stage] = {}
    for info in pkgutil.iter_modules(__path__):
        if info.name.startswith("_"):
            continue
        module = importlib.import_module(f"{__name__}.{info.name}")
        stages = list(getattr(module, "STAGES", [])) + ([module.STAGE] if hasattr(module, "STAGE") else [])
        for stage in stages:
            if stage.name in found:
                raise RuntimeError(f"stage {stage.name} is registered twice ({info.name})")
            found[stage.name] = stage
    return found


def get_stage(name: str) -> Stage:
    stages = all_stages()
    if name not in stages:
        close = difflib.get_close_matches(name, stages, n=1)
        hint = f"; did you mean '{close[0]}'?" if close else ""
        raise RufusError(f"unknown stage '{name}'{hint} (the stages are: {', '.join(sorted(stages))})")
    return stages[name]


def check_config(config) -> None:
    """Every check that needs nothing loaded, run by --dry_run and before a run does any work (a
    catalog mixed, a model loaded): the model reference first, then the common guards and the
    playbook's advice, the data columns, the stage's own. Imports no torch: a dry run answers in seconds."""
    from rufus_data.models.reference import require_loadable
    from rufus_train import guards, guidance
    from rufus_train.data import check_columns

    stage = get_stage(config.stage)
    require_loadable(config.model)
    guards.check_stage(config)
    guidance.check_stage(config)
    check_columns(config.data, stage.required_columns, config.stage)
    stage.check(config)
