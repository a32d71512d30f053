"""TRL's spellings of what `rufus-train stage` calls otherwise (`trl sft --model_name_or_path ...
--use_peft --lora_r 16`): each taken as the stage key that means the same, with a note, or refused
with the key to write (rufus_data/base/borrowed_options.py). TRL keys that are fields of the stage's
TRL config need no entry: they are taken into `trainer:` (trl_keys.py)."""

from __future__ import annotations

from rufus_data.base.borrowed_options import Borrowed, is_true
from rufus_data.base.errors import RufusError


def _as(key: str):
    return lambda value: [key, value] if value is not None else [key]


def _use_peft(value: str | None) -> list[str]:
    return ["--lora.enabled", "true" if is_true("--use_peft", value) else "false"]


def _bf16(value: str | None) -> list[str]:
    return ["--dtype", "auto" if is_true("--bf16", value) else "float32"]


def _fp16(value: str | None) -> list[str]:
    if is_true("--fp16", value):
        raise RufusError("--fp16: Rufus picks the precision from --dtype: auto autocasts in fp16 on a GPU without "
                         "bf16 (and in bf16 where it has it); --dtype float16 loads fp16 weights. Drop --fp16")
    return []


def _target_modules(value: str | None) -> list[str]:
    modules = [m for m in (value or "").replace(",", " ").split() if m]
    return ["--lora.target_modules", "[" + ", ".join(modules) + "]"]


def _warmup_ratio(value: str | None) -> list[str]:
    try:
        ratio = float(value or "")
    except ValueError:
        raise RufusError(f"--warmup_ratio {value!r}: give a fraction of the training steps, 0 <= R < 1") from None
    if not 0 <= ratio < 1:
        raise RufusError(f"--warmup_ratio {value}: a ratio is below 1 (warmup_steps {value} would be that many steps)")
    return ["--trainer.warmup_steps", value]


def _save_strategy(value: str | None) -> list[str]:
    if value in ("no", "false", "False"):  # YAML reads an unquoted `no` as false
        return ["--save_steps", "null"]
    if value == "steps":
        return []
    raise RufusError(f"--save_strategy {value}: Rufus checkpoints by optimizer steps, every --save_steps N (resume, "
                     "checkpoint_mirror and eval.eval_on_checkpoint read them), and saves the final model at the end; "
                     "for a checkpoint each epoch give --save_steps the steps of one epoch (rows / (batch x "
                     "accumulation x processes)), or --save_strategy no for the final model only")


TRL_SPELLINGS = (
    Borrowed("--model_name_or_path", "TRL", "`--model`", _as("--model"), example="tiny-random",
             shows="model: tiny-random"),
    Borrowed("--dataset_name", "TRL", "`--data`", _as("--data"),
             note="Rufus trains on shard folders or rufus-data catalogs; a hub dataset is a catalog's `hub:` source",
             example="catalogs/data/tulu3_mini_sft.yaml", shows="- catalogs/data/tulu3_mini_sft.yaml"),
    Borrowed("--use_peft", "TRL", "`--lora.enabled` (LoRA is Rufus's default)", _use_peft, takes="flag",
             shows="enabled: true"),
    Borrowed("--lora_r", "TRL", "`--lora.r`", _as("--lora.r"), example="16", shows="r: 16"),
    Borrowed("--lora_alpha", "TRL", "`--lora.alpha`", _as("--lora.alpha"), example="32", shows="alpha: 32"),
    Borrowed("--lora_dropout", "TRL", "`--lora.dropout`", _as("--lora.dropout"), example="0.05", shows="dropout: 0.05"),
    Borrowed("--lora_target_modules", "TRL", "`--lora.target_modules` (a list)", _target_modules, takes="values",
             example="q_proj v_proj", shows="target_modules:\n  - q_proj\n  - v_proj"),
    Borrowed("--max_seq_length", "TRL", "`--max_length` (TRL's own name since 0.20)", _as("--max_length"),
             example="512", shows="max_length: 512"),
    Borrowed("--bf16", "TRL", "`--dtype auto` (false: `--dtype float32`)", _bf16, takes="flag",
             note="TRL's bf16 is bf16 autocast over fp32 weights: what dtype auto does on a GPU with bf16",
             shows="dtype: auto"),
    Borrowed("--fp16", "TRL", "refused: `--dtype` decides", _fp16, takes="flag", shows="Rufus picks the precision"),
    Borrowed("--save_strategy", "TRL", "`no`: `--save_steps null`; `steps`: what Rufus does; `epoch`/`best` "
             "refused: `--save_steps N`", _save_strategy, example="no",
             note="no checkpoint during the run; the final model is still saved", shows="save_steps: null"),
    Borrowed("--warmup_ratio", "TRL", "`--trainer.warmup_steps R` (R < 1)", _warmup_ratio,
             note="TRL 1.16 on transformers 5 has no warmup_ratio: a warmup_steps below 1 is the ratio",
             example="0.1", shows="warmup_steps: 0.1"),
)
