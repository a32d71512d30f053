"""Stage configs: a strict pydantic model per stage, the schema of catalogs/stages/NAME.yaml
(reading that YAML and the command line's overrides into it is config_loading.py's).

Keys a stage shares live on `StageConfig`; each stage subclasses it with its own keys. What
Rufus does not model goes into the free-form `trainer:` block, which is passed to the TRL config
dataclass and checked against its fields (unknown keys are errors with the nearest valid one)."""

from __future__ import annotations

import importlib
from typing import Any, ClassVar, Literal

from pydantic import Field, model_validator

from rufus_data.base.catalog_files import docs_page
from rufus_data.base.yaml_config import StrictModel
from rufus_data.models.devices import DeviceRoles
from rufus_eval.checkpoint_eval.config import CheckpointEvalConfig

DEFAULT_ATTENTION_PROJECTIONS = ["q_proj", "k_proj", "v_proj", "o_proj"]


class LoraSettings(StrictModel):
    """LoRA adapter: rank 4 on the attention projections by default; the base stays frozen."""

    enabled: bool = Field(True, description="train a LoRA adapter on the frozen base; false: full fine-tuning")
    method: str = Field("lora", description="peft method; only LoRA is supported (prompt learning is refused)")
    r: int = Field(4, ge=1, description="adapter rank: the inner dimension of each low-rank update")
    alpha: int | None = Field(None, description="lora_alpha; null means 2 x r")
    dropout: float = Field(0.0, ge=0.0, lt=1.0, description="lora_dropout: dropout probability on the adapter's input")
    target_modules: list[str] = Field(
        default_factory=lambda: list(DEFAULT_ATTENTION_PROJECTIONS),
        description="names of the modules the adapter wraps (default: the attention projections q/k/v/o_proj)")
    continue_adapter: bool = Field(
        False, description="the starting model is a LoRA run: train its adapter further on its base (the reference "
        "of DPO and RL is then that base, the adapter off) instead of merging it and adding a new adapter; set by a "
        "pipeline's `adapter: one`",
    )

    @model_validator(mode="after")
    def _continue_needs_lora(self) -> LoraSettings:
        if self.continue_adapter and not self.enabled:
            raise ValueError("continue_adapter trains the starting run's LoRA adapter further, and enabled is false "
                             "(full fine-tuning): drop one of them")
        return self

    @model_validator(mode="after")
    def _resolve_alpha(self) -> LoraSettings:
        if self.alpha is None:  # resolved here so that --dry-run shows the value used
            object.__setattr__(self, "alpha", 2 * self.r)
        return self

    @property
    def lora_alpha(self) -> int:
        return self.alpha if self.alpha is not None else 2 * self.r


class StageConfig(StrictModel):
    """Keys every stage has. Subclasses set the learning-rate defaults and the TRL config class."""

    # Learning rate when none is given: full fine-tuning vs LoRA (about 10x higher).
    full_ft_learning_rate: ClassVar[float] = 1e-5
    lora_learning_rate: ClassVar[float] = 1e-4
    # Import path of the TRL config dataclass the `trainer:` block is checked against.
    trl_config: ClassVar[str] = "trl.SFTConfig"
    # Keys of this model that map to a TRL field of another name (so `trainer:` cannot set them twice).
    trl_aliases: ClassVar[dict[str, str]] = {}
    # Stages with no use for max_length say why here; setting it is then refused (never silently dropped).
    max_length_unused_because: ClassVar[str | None] = None
    # Stages that train against a vLLM generation server (GRPO) have a `devices.server` role.
    generation_server: ClassVar[bool] = False
    # What a logged step's console line shows (rufus_train/step_progress.py): (label, logged key, kind).
    progress_metrics: ClassVar[tuple[tuple[str, str, str | None], ...]] = (("loss", "loss", None),)

    stage: str = Field(description="stage name (from the registry)")
    model: str = Field("smollm2-135m", description="built-in name, local folder, run folder, or hub id")
    chat_template: str | None = Field(
        None, description="the chat template to train with, in place of the model's (a base model ships none): a shipped "
        "name (rufus_chatml, or a family TRL stores such as qwen2_5 or llama3_1) or a .jinja file; saved with the model")
    data: list[str] = Field(default_factory=list, description="shard folder(s) written by rufus-data")
    max_rows: int | None = Field(None, ge=1, description="use only the first N rows (after a seeded shuffle)")
    output_dir: str = Field("runs/{stage}", description="the run folder; {stage} is the stage's name")
    overwrite: bool = Field(False, description="replace an output_dir that already holds a run (never when resuming)")
    lora: LoraSettings = Field(default_factory=LoraSettings, description="the LoRA adapter, or full fine-tuning")
    learning_rate: float | None = Field(None, gt=0, description="null: full FT or LoRA default of the stage")
    max_steps: int = Field(-1, description="optimizer steps to train; -1: num_train_epochs decides")
    num_train_epochs: float = Field(1.0, description="passes over the data (a fraction allowed) when max_steps is -1")
    per_device_train_batch_size: int = Field(8, ge=1, description="examples per process in each forward pass")
    gradient_accumulation_steps: int = Field(
        1, ge=1, description="forward passes per optimizer step: a step sees batch x accumulation x processes examples")
    max_length: int | None = Field(  # TRL's default; measured against the shipped SFT catalogs in docs/train.md
        1024, ge=8, description="tokens per training example (prompt and completion); TRL truncates longer ones")
    seed: int = Field(42, description="seed of the max_rows sample, the LoRA initialisation, data order and sampling")
    report_to: list[Literal["none", "trackio", "wandb", "tensorboard"]] = Field(
        default_factory=lambda: ["none"], description="trackers the trainer logs to (project rufus); none: only "
        "metrics.jsonl and train.log")
    save_steps: int | None = Field(
        500, ge=1, description="optimizer steps between checkpoints (each one evaluated when eval.eval_on_checkpoint); "
        "null: no checkpoint during the run, only the final model (TRL's save_strategy no)")
    logging_steps: int = Field(10, ge=1, description="optimizer steps between logged metrics (metrics.jsonl, trackers)")
    gradient_checkpointing: bool = Field(
        True, description="recompute activations in the backward pass: less memory, more compute")
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "auto", description="auto: on a GPU with native bf16, full fine-tuning keeps fp32 master weights (and fp32 AdamW "
        "states) and computes under bf16 autocast, async GRPO included; LoRA keeps its frozen base in bf16 and its "
        "adapter in fp32; an older GPU: fp16 autocast with a gradient scaler over fp32 weights; CPU: fp32. bfloat16: "
        f"pure bf16 (full fine-tuning: no fp32 masters, warned); float32, float16 as named ({docs_page('train.md')}, Precision)"
    )
    resume_from_checkpoint: str | None = Field(
        None, description="latest: the newest complete checkpoint of output_dir, else of checkpoint_mirror, else a fresh "
        "run (one command line for the first run and every restart); or the path of a checkpoint"
    )
    checkpoint_mirror: str | None = Field(
        None, description="a folder or fsspec URL (s3://, gs://, file://) each complete checkpoint is copied to in the "
        "background, save_total_limit applied; `latest` restores from it when output_dir has none"
    )
    num_processes: int | None = Field(
        None, ge=1, description="processes `rufus-train stage` launches with accelerate (null: one, or the accelerate config's)"
    )
    accelerate_config: str | None = Field(
        None, description="ddp | fsdp2 | zero2 | zero3 (catalogs/accelerate/) or a file: `rufus-train stage` launches with it"
    )
    trainer: dict[str, Any] = Field(default_factory=dict, description="extra TRL config fields, checked")
    push_to_hub: str | None = Field(
        None, description="ORG/NAME: upload the run (adapter or full model, Rufus's model card) to this Hub repo at the end"
    )
    push_merged: bool = Field(False, description="with LoRA: push RUN/merged (adapter merged into its base) instead")
    push_private: bool = Field(True, description="create the Hub repo private (an existing repo keeps its visibility)")
    eval: CheckpointEvalConfig = Field(
        default_factory=CheckpointEvalConfig, description="checkpoint evaluation during training (rufus_eval)"
    )
    devices: DeviceRoles = Field(
        default_factory=DeviceRoles, description="GPU ids of each role: trainer, vLLM server (GRPO), checkpoint evaluation"
    )

    @model_validator(mode="before")
    @classmethod
    def _listify(cls, data: Any) -> Any:
        if isinstance(data, dict):
            data = dict(data)
            for key in ("data", "report_to"):
                if isinstance(data.get(key), str):
                    data[key] = [data[key]]
            data = _route_trl_push(data)
            if isinstance(data.get("eval"), dict) and "eval_devices" in data["eval"]:
                raise ValueError("eval.eval_devices is now devices.eval, the GPU roles of every stage: write "
                                 f"`devices: {{eval: \"{data['eval']['eval_devices']}\"}}` (or --devices.eval)")
        return data

    @model_validator(mode="after")
    def _device_roles(self) -> StageConfig:
        """With checkpoint evaluation on, its GPUs are devices.eval, its default resolved here once
        (so every pair of roles is checked against them); a server role needs a stage that has one."""
        if self.devices.server is not None and not self.generation_server:
            raise ValueError(f"devices.server ({self.devices.server}): stage {self.stage} trains against no vLLM "
                             "server (GRPO stages do); remove it")
        if self.eval.eval_on_checkpoint:
            object.__setattr__(self, "devices", self.devices.with_evaluation())
        return self

    @model_validator(mode="after")
    def _push_settings(self) -> StageConfig:
        if self.push_to_hub:
            from huggingface_hub.utils import HFValidationError, validate_repo_id

            try:
                validate_repo_id(self.push_to_hub)
            except HFValidationError as err:
                raise ValueError(f"push_to_hub {self.push_to_hub!r} is not a Hub repo id ({err}): write ORG/NAME") from None
            if "/" not in self.push_to_hub:
                raise ValueError(f"push_to_hub {self.push_to_hub!r} names no owner: write ORG/NAME")
        if self.push_merged and not (self.push_to_hub and self.lora.enabled):
            raise ValueError("push_merged pushes the merged copy of a LoRA run: set push_to_hub: ORG/NAME and keep "
                             "lora enabled, or remove push_merged (a full fine-tuning run is pushed as it is)")
        return self

    @model_validator(mode="after")
    def _checkpoints_when_read(self) -> StageConfig:
        """save_steps null writes no checkpoint: what reads checkpoints would then do nothing."""
        if self.save_steps is None:
            readers = [key for key, on in (("eval.eval_on_checkpoint", self.eval.eval_on_checkpoint),
                                           ("checkpoint_mirror", self.checkpoint_mirror)) if on]
            if readers:
                raise ValueError(f"save_steps null writes no checkpoint, but {' and '.join(readers)} reads them: give "
                                 f"save_steps N, or remove {' and '.join(readers)}")
        return self

    @model_validator(mode="after")
    def _trains_some_steps(self) -> StageConfig:
        """max_steps 0 trained one step and said so; below -1 means nothing either."""
        if self.max_steps == 0 or self.max_steps < -1:
            raise ValueError(f"max_steps {self.max_steps} trains nothing: give N >= 1 optimizer steps, or -1 to let "
                             "num_train_epochs decide")
        return self

    @model_validator(mode="after")
    def _refuse_unused_max_length(self) -> StageConfig:
        if self.max_length is not None and self.max_length_unused_because:
            raise ValueError(
                f"max_length ({self.max_length}) is not used by {self.stage}: {self.max_length_unused_because}. "
                "Remove max_length and set max_completion_length"
            )
        return self

    @model_validator(mode="after")
    def _resolve_defaults(self) -> StageConfig:
        if self.learning_rate is None:
            lr = self.lora_learning_rate if self.lora.enabled else self.full_ft_learning_rate
            object.__setattr__(self, "learning_rate", lr)
        for key in ("output_dir", "checkpoint_mirror"):
            value = getattr(self, key)
            if value and "{stage}" in value:
                object.__setattr__(self, key, value.replace("{stage}", self.stage))
        return self

    def trl_kwargs(self) -> dict[str, Any]:
        """Stage-specific TRL config fields; subclasses extend (common fields: rufus_train/trl_args.py)."""
        return {"max_length": self.max_length}


TRL_HUB_KEYS = ("push_to_hub", "hub_model_id", "hub_private_repo")


def _route_trl_push(data: dict) -> dict:
    """`trainer.push_to_hub` (TRL's flag) uploads inside save_model, before Rufus's model card:
    with `trainer.hub_model_id` it becomes the stage's `push_to_hub` (and `hub_private_repo` its
    `push_private`); without one it is refused, naming the key to write."""
    trainer = data.get("trainer")
    if not isinstance(trainer, dict) or not trainer.get("push_to_hub"):
        return data
    repo = trainer.get("hub_model_id")
    if not repo:
        raise ValueError("trainer.push_to_hub would upload inside TRL's save_model, before Rufus writes the model "
                         "card, to a repo named after output_dir: write the stage key `push_to_hub: ORG/NAME` "
                         "(or --push_to_hub ORG/NAME) instead")
    if data.get("push_to_hub") not in (None, repo):
        raise ValueError(f"push_to_hub ({data['push_to_hub']}) and trainer.hub_model_id ({repo}) name two repos: keep one")
    routed = {**data, "push_to_hub": repo, "trainer": {k: v for k, v in trainer.items() if k not in TRL_HUB_KEYS}}
    if "hub_private_repo" in trainer and trainer["hub_private_repo"] is not None:
        routed["push_private"] = bool(trainer["hub_private_repo"])
    return routed


def trl_config_class(config_cls: type[StageConfig]) -> type:
    """The TRL config dataclass a stage's `trainer:` block is checked against and built into."""
    module, _, name = config_cls.trl_config.rpartition(".")
    return getattr(importlib.import_module(module), name)
