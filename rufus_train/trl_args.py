"""The TRL config of a stage: the fields every stage sets the same way, the stage's own, and the
`trainer:` block on top. Below the stages: the runner builds a run's TRL config with it, and the
async GRPO checks (grpo/async_config.py) read what a sync run would ask TRL for."""

from __future__ import annotations

from pathlib import Path

from rufus_data.base.errors import RufusError
from rufus_data.base.quiet_bars import bars_off
from rufus_train import modeling
from rufus_train.config import StageConfig, trl_config_class
from rufus_train.run_summary import tracker_settings


def common_trl_kwargs(config: StageConfig, output_dir: Path) -> dict:
    import torch  # heavy: only when a run builds its TRL config

    precision = modeling.precision(config.dtype, full_finetune=not config.lora.enabled)
    return {
        "output_dir": str(output_dir),
        "learning_rate": config.learning_rate,
        "max_steps": config.max_steps,
        "num_train_epochs": config.num_train_epochs,
        "per_device_train_batch_size": config.per_device_train_batch_size,
        "gradient_accumulation_steps": config.gradient_accumulation_steps,
        "seed": config.seed,
        "report_to": [r for r in config.report_to if r != "none"] or "none",
        "save_strategy": "steps" if config.save_steps else "no",  # null: only the final model (save_final)
        "save_steps": config.save_steps,
        "logging_steps": config.logging_steps,
        "logging_nan_inf_filter": False,  # a NaN loss is logged as NaN, and stops the run (divergence.py)
        "activation_checkpointing": config.gradient_checkpointing,  # transformers 5's name; the old one warns
        "bf16": precision.bf16,
        "fp16": precision.fp16,  # transformers adds the gradient scaler
        # without CUDA, accelerate treats processes started by torchrun as MULTI_CPU (gloo) only with
        # use_cpu; otherwise each rank trains alone (DistributedType.NO) and every rank is "process zero"
        "use_cpu": not torch.cuda.is_available(),
        "dataloader_num_workers": 0,
        "disable_tqdm": bars_off(),  # off a terminal (quiet_bars.py): the logged lines, no bar redraws
        **tracker_settings(config.stage, output_dir),  # project `rufus`, a run name from stage and folder
    }


def trl_kwargs_for(config: StageConfig, output_dir: Path) -> dict:
    """Every field the stage sets on its TRL config: the common ones, the stage's, the `trainer:` block.
    A mapping the stage sets (online_dpo's generation_kwargs) is merged with the user's, key by key."""
    kwargs = {**common_trl_kwargs(config, output_dir), **config.trl_kwargs()}
    for key, value in config.trainer.items():
        merge = isinstance(value, dict) and isinstance(kwargs.get(key), dict)
        kwargs[key] = {**kwargs[key], **value} if merge else value
    return kwargs


def build_trl_args(config: StageConfig, output_dir: Path):
    kwargs = trl_kwargs_for(config, output_dir)
    try:
        return trl_config_class(type(config))(**kwargs)
    except (ValueError, TypeError) as err:
        raise RufusError(f"stage {config.stage}: TRL refused the config ({err}); change the key it names") from None
