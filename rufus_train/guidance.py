"""The Smol training playbook's guidance, said where it applies: warnings at config time (before
anything loads, in `rufus-train stage`, `pipeline` and their `--dry-run`), each with the
playbook's reason and the setting to change. Nothing here refuses a run: these are the recipe's
advice, not rules a trainer breaks on.

- packing in SFT with the stage's unpacked learning rate;
- a preference stage (dpo, kto, orpo) over more than one epoch;
- a preference stage (dpo and its apo_zero, kto, orpo, online_dpo) whose beta is outside the
  playbook's 0.01-0.5 sweep (SmolLM3's best: 0.1);
- in a pipeline, a preference stage whose learning rate is not 5-20x below the SFT stage before it."""

from __future__ import annotations

import warnings

from rufus_data.base.console import console
from rufus_data.base.errors import SaidWarning

PACKED_STAGES = ("sft", "sft_full")  # midtrain packs by definition (continued pretraining)
SFT_STAGES = ("sft", "sft_full")
PREFERENCE_STAGES = ("dpo", "kto", "orpo")
PREFERENCE_LR_BELOW_SFT = (5.0, 20.0)  # the playbook: the preference learning rate 5-20x below SFT's
BETA_STAGES = ("dpo", "kto", "orpo", "online_dpo")
PREFERENCE_BETA_RANGE = (0.01, 0.5)  # the playbook sweeps beta over 0.01-0.5; SmolLM3's best was 0.1
# the length-normalised loss averages log-ratios per token: its beta lives on another scale (Tulu 3: 5)
PER_TOKEN_LOSSES = ("sigmoid_norm",)


class GuidanceWarning(SaidWarning):
    """A setting the Smol training playbook advises against (the run goes on)."""


def warn(message: str) -> None:
    console.print(f"[bold yellow]warning:[/] {message}", highlight=False, soft_wrap=True)
    warnings.warn(message, GuidanceWarning, stacklevel=3)


def default_learning_rate(config) -> float:
    """The learning rate a stage trains at when none is set (its field default, else full FT / LoRA)."""
    field_default = type(config).model_fields["learning_rate"].default
    if field_default is not None:
        return field_default
    return config.lora_learning_rate if config.lora.enabled else config.full_ft_learning_rate


def check_stage(config) -> None:
    """The guidance one stage's config can be judged on by itself."""
    if config.stage in PACKED_STAGES and getattr(config, "packing", False):
        unpacked = default_learning_rate(config)
        if config.learning_rate >= unpacked:
            warn(f"{config.stage}: packing at learning_rate {config.learning_rate:g}, the stage's unpacked rate. "
                 "Packing fills every sequence with several conversations, so each step carries more tokens and "
                 "fewer steps are taken; the Smol playbook lowers the learning rate when it packs. Set a lower "
                 "--learning_rate, or --no-packing")
    epochs_decide = (config.max_steps or -1) <= 0
    if config.stage in PREFERENCE_STAGES and epochs_decide and config.num_train_epochs > 1:
        warn(f"{config.stage}: num_train_epochs {config.num_train_epochs:g}. The Smol playbook trains preference "
             "optimisation for one epoch: later passes over the same pairs overfit them. To use more pairs, split the data and run another round from this "
             "stage's output (a pipeline of preference stages); set num_train_epochs: 1")
    check_preference_beta(config)


def check_preference_beta(config) -> None:
    """The playbook's beta sweep for preference optimisation; a per-token (length-normalised) loss
    is left out, since its beta is on another scale."""
    low, high = PREFERENCE_BETA_RANGE
    if config.stage not in BETA_STAGES or getattr(config, "loss_type", None) in PER_TOKEN_LOSSES:
        return
    if not low <= config.beta <= high:
        warn(f"{config.stage}: beta {config.beta:g} is outside the Smol playbook's {low:g}-{high:g} range for "
             "preference optimisation (SmolLM3's best: 0.1); set beta within it, e.g. 0.1")


def check_pipeline(stages: list, recipe: str | None = None) -> None:
    """Guidance on how a pipeline's stages relate: each preference stage against the SFT stage it
    follows, when both train the same way (both LoRA or both full: LoRA's rates are about 10x higher).
    `recipe`: the source the pipeline's values are copied from; the warning then says the rate is its."""
    low, high = PREFERENCE_LR_BELOW_SFT
    sft = None
    for config in stages:
        if config.stage in SFT_STAGES:
            sft = config
        elif config.stage in PREFERENCE_STAGES and sft is not None and sft.lora.enabled == config.lora.enabled:
            ratio = sft.learning_rate / config.learning_rate
            if not low <= ratio <= high:
                why = ("it starts from a model that already fits the answers, and near SFT's rate it drifts from "
                       "its reference" if ratio < low else "so far below, the stage barely moves the model")
                warn(f"{config.stage}: learning_rate {config.learning_rate:g} is {ratio:.3g}x below the "
                     f"{sft.stage} stage it follows ({sft.learning_rate:g}); the Smol playbook sets the preference "
                     f"learning rate {low:g}-{high:g}x below SFT's ({why}). Try learning_rate "
                     f"{sft.learning_rate / 10:g} (10x below)" + (
                         f". This pipeline ships {config.learning_rate:g} because its recipe sets it ({recipe}): "
                         "the run reproduces the recipe, the playbook would not" if recipe else ""))
