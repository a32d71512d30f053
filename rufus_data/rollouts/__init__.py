"""`rufus-data filter` and `rufus-data pairs`: the data steps that sample a policy's answers
(rollouts) on RL prompts and score them with the rewards.

    filter.py    filter_prompts(inputs, out, settings): bucket prompts by k scored rollouts:
                 all_pass / learnable / all_fail ...; rebucket() from stored rollouts
    pairs.py     build_pairs(inputs, out, settings): preference pairs from sampled answers
                 (strong vs weak, best vs worst, perturbed)
    options.py   their settings: GenerationOptions (shared), FilterConfig, PairsConfig
    prompts.py   their inputs: rl shard folders or catalogs (mixed first) -> generation prompts
    scoring.py   the rewards called on sampled completions, as TRL calls them
    journal.py   resumable generation: finished prompts appended to a JSONL journal
    plan.py      --dry-run: the generation a run would do (prompts x samples x tokens, backend, rewards)

They stand on the floors below: the generation engine (rufus_data/generate/), the rewards
(rufus_data/rewards/) and the shard folder (rufus_data/folders/shards.py).

The names below are imported when first used (lazy_exports.py): `rufus-data` reads options.py at
start, and this file must not load arrow or a model library for it."""

from __future__ import annotations

from rufus_data.base.lazy_exports import lazy_exports

__all__ = ["FilterConfig", "PairsConfig", "build_pairs", "filter_prompts", "rebucket"]

__getattr__ = lazy_exports(__name__, {
    "FilterConfig": "options", "PairsConfig": "options", "build_pairs": "pairs", "filter_prompts": "filter",
    "rebucket": "filter",
})
