"""Which fields of a stage's TRL config the user sets, and which Rufus sets itself.

A TRL user writes `--warmup_steps 0.1` as `trl sft` takes it; in Rufus the TRL fields Rufus
leaves open live under `trainer:`. So a key that is no stage key but a field of the stage's TRL
config is taken into `trainer:` (with a note), whether written at the top level of a stage YAML,
a pipeline's stage entry or the command line. A field Rufus sets itself (from one of its own
keys, or from the machine) is refused, there or in `trainer:`, naming what to write instead:
the set is what trl_args.common_trl_kwargs and the stage's `trl_kwargs()` pass TRL."""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

# What trl_args.common_trl_kwargs sets on every stage's TRL config, by where it comes from:
# the Rufus key of that name or another, or (RUFUS_SETS) nothing the user writes. A test keeps
# these three lists and common_trl_kwargs together.
COMMON_TRL_FIELDS = {
    "output_dir": "output_dir",
    "learning_rate": "learning_rate",
    "max_steps": "max_steps",
    "num_train_epochs": "num_train_epochs",
    "per_device_train_batch_size": "per_device_train_batch_size",
    "gradient_accumulation_steps": "gradient_accumulation_steps",
    "seed": "seed",
    "report_to": "report_to",
    "save_strategy": "save_steps",  # "steps", or "no" where save_steps is null (only the final model)
    "save_steps": "save_steps",
    "logging_steps": "logging_steps",
    "activation_checkpointing": "gradient_checkpointing",
    "bf16": "dtype",  # the precision follows from dtype, LoRA and the GPU (modeling.precision)
    "fp16": "dtype",
}
# Set by Rufus from nothing the user writes, and why the user may not set them.
RUFUS_SETS = {
    "use_cpu": "Rufus sets it from the machine (CPU when no CUDA GPU is visible): to train on CPU, hide the GPUs "
               "with CUDA_VISIBLE_DEVICES=",
    "dataset_text_field": "the stage builds its dataset's columns itself",
    "logging_nan_inf_filter": "Rufus logs a NaN or infinite loss as it is and stops the run there "
                              "(rufus_train/divergence.py)",
}
# Rufus's own defaults that `trainer:` may change (the tracker's names, the data loader, progress bars).
RUFUS_DEFAULTS = frozenset({"project", "run_name", "dataloader_num_workers", "disable_tqdm"})
# Fields a stage's trl_kwargs() derives from a stage key of another name than its trl_aliases say.
DERIVED_FROM = {"use_vllm": "vllm_server", "vllm_mode": "vllm_server"}
# Fields Rufus does under its own key, by other means (push.py uploads after its model card).
RUFUS_KEY_OF = {"hub_model_id": "push_to_hub", "hub_private_repo": "push_private"}


def trl_fields(trl_class: type) -> dict[str, dataclasses.Field]:
    return {field.name: field for field in dataclasses.fields(trl_class)}


def trl_field_type(trl_class: type, name: str) -> Any:
    return typing.get_type_hints(trl_class).get(name)


# Keys every stage has that reach TRL under another name (transformers 5 renamed the field).
COMMON_TRL_ALIASES = {"gradient_checkpointing": "activation_checkpointing"}


@dataclass(frozen=True)
class Managed:
    """A TRL field Rufus sets: from its key `key`, or (key None) itself, for `reason`."""

    key: str | None
    reason: str | None = None

    def instead(self, config_cls) -> str:
        """What to write instead, with the key's choices where it has a few."""
        if self.key is None:
            return f"{self.reason}; remove it"
        choices = typing.get_args(config_cls.model_fields[self.key].annotation)
        listed = f" ({', '.join(map(str, choices))})" if choices and all(isinstance(c, str) for c in choices) else ""
        return f"use the top-level key '{self.key}'{listed} instead"


def managed_fields(config) -> dict[str, Managed]:
    """Every field Rufus sets on this stage's TRL config, with where it comes from. A mapping the
    stage sets (online_dpo's generation_kwargs) is merged with the user's, so it stays open."""
    cls = type(config)
    aliases = {trl: mine for mine, trl in {**COMMON_TRL_ALIASES, **cls.trl_aliases}.items()}
    managed = {name: Managed(name) for name in cls.model_fields}
    stage_set = {k for k, v in config.trl_kwargs().items() if not isinstance(v, dict)}
    for name in sorted(stage_set | set(COMMON_TRL_FIELDS)):
        key = aliases.get(name) or COMMON_TRL_FIELDS.get(name) or DERIVED_FROM.get(name)
        if key or name in cls.model_fields:
            managed[name] = Managed(key or name)
        elif name not in RUFUS_DEFAULTS:
            managed[name] = Managed(None, RUFUS_SETS.get(name, f"Rufus sets it for stage {config.stage}"))
    for name, why in RUFUS_SETS.items():
        managed.setdefault(name, Managed(None, why))
    for name, key in RUFUS_KEY_OF.items():
        managed.setdefault(name, Managed(key))
    return managed


@dataclass(frozen=True)
class TakenKey:
    """A TRL key written outside `trainer:`, taken into it: where it was written, and as what."""

    where: str  # `sft.yaml:12`, `command line --warmup_steps`
    written: str  # the key as written (`warmup_steps`, `no_disable_tqdm`)

    def note(self, key: str) -> str:
        named = self.where if self.where.endswith(self.written) else f"{self.where}: {self.written}"
        return f"note: {named} is a TRL key: taken as trainer.{key}"


def is_trl_key(key: str, stage_keys: Iterable[str], fields: dict[str, dataclasses.Field]) -> bool:
    """A top-level key (its first dotted part) that is no stage key but a field of the TRL config."""
    head = key.split(".")[0]
    return head not in stage_keys and head in fields


def take_from_mapping(data: dict, stage_keys: Iterable[str], fields: dict, where_of) -> tuple[dict, dict[str, TakenKey]]:
    """`data` (a stage YAML, a pipeline's stage entry) with each TRL key written at its top level
    moved into its `trainer:` mapping; `where_of(key)` names where the key was written."""
    from rufus_data.base.errors import RufusError

    out, taken = dict(data), {}
    for key in [k for k in data if isinstance(k, str) and is_trl_key(k, stage_keys, fields)]:
        trainer = out.get("trainer") or {}
        if not isinstance(trainer, dict):
            continue  # validation names the bad trainer block itself
        if key in trainer:
            raise RufusError(f"{where_of(key)}: {key} is written twice, at the top level and as trainer.{key}: keep one")
        out["trainer"] = {**trainer, key: out.pop(key)}
        taken[key] = TakenKey(where_of(key), key)
    return out, taken


def take_from_pairs(pairs: list[tuple[str, str | None]], stage_keys: Iterable[str], trl_class: type,
                    overrides_from: str) -> tuple[list[tuple[str, str | None]], dict[str, TakenKey]]:
    """Command-line `(key, raw value)` pairs with each TRL key written as `--key` taken as
    `--trainer.key` (`--no_key` as `--trainer.key false` for a boolean field)."""
    from rufus_data.base.errors import RufusError

    stage_keys, fields = set(stage_keys), trl_fields(trl_class)
    out, taken, in_trainer = [], {}, set()
    for key, raw in pairs:
        written, negated = key, key.removeprefix("no_")
        if raw is None and negated != key and negated not in stage_keys and trl_field_type(trl_class, negated) in (
                bool, bool | None):
            key, raw = negated, "false"
        if is_trl_key(key, stage_keys, fields):
            taken[key.split(".")[0]] = TakenKey(overrides_from.format(key=written), written)
            key = f"trainer.{key}"
        elif key.startswith("trainer."):
            in_trainer.add(key.split(".")[1])
        out.append((key, raw))
    for head in sorted(set(taken) & in_trainer):
        raise RufusError(f"{taken[head].where}: {head} is given twice, as --{taken[head].written} and as "
                         f"--trainer.{head}: keep one")
    return out, taken


def take_from_overrides(overrides: dict[str, Any], stage_keys: Iterable[str], fields: dict,
                        overrides_from: str) -> tuple[dict[str, Any], dict[str, TakenKey]]:
    """Dotted overrides (a pipeline's stage entry) with each TRL key taken as `trainer.key`, set
    after any `trainer` mapping among them (which would replace it otherwise)."""
    from rufus_data.base.errors import RufusError

    kept = {k: v for k, v in overrides.items() if not is_trl_key(k, stage_keys, fields)}
    taken = {}
    for key in [k for k in overrides if k not in kept]:
        head = key.split(".")[0]
        where = overrides_from.format(key=key)
        if head in (kept.get("trainer") or {}) or f"trainer.{head}" in kept:
            raise RufusError(f"{where}: {head} is written twice, at the top level and as trainer.{head}: keep one")
        kept[f"trainer.{key}"] = overrides[key]
        taken[head] = TakenKey(where, key)
    return kept, taken


def near_trl_keys(data: dict, stage_keys: Iterable[str], fields: dict) -> str:
    """A hint for each unknown top-level key that is close to a TRL field but to no stage key
    (`warmup_step`: the stage's own did-you-mean finds nothing near it)."""
    import difflib

    hints = []
    for key in [k for k in data if isinstance(k, str) and k not in stage_keys]:
        near = difflib.get_close_matches(key, list(fields), n=1)
        if near and not difflib.get_close_matches(key, list(stage_keys), n=1):
            hints.append(f"; '{key}' is close to the TRL key '{near[0]}' (written so, it is taken as "
                         f"trainer.{near[0]})")
    return "".join(hints)
