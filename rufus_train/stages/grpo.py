"""What every GRPO stage shares: the config keys, the checks that run before anything loads, the
dataset of prompts, and the trainer (Rufus's dynamic-sampling GRPOTrainer, or TRL's
AsyncGRPOTrainer against a vLLM server with `grpo_execution: async`).

Rewards are named through the rewards registry (`rewards: ["string_match:gsm8k", {name: ...,
weight: 0.5}]`), their weights become TRL's `reward_weights`. Generation runs in the trainer
(transformers) by default, on a vLLM server with `vllm_server: URL` (sync server mode), or
asynchronously. Before the tokenizer, dataset or model load, `check` reads the context limit
(the server's max_model_len, else the model's max_position_embeddings) and refuses a
`max_completion_length` that cannot fit; once the prompts are tokenized the longest prompt plus
`max_completion_length` is checked too (vLLM would cut it silently)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, ClassVar, Literal

import pyarrow as pa
from pydantic import Field, model_validator

from rufus_data.console import console
from rufus_data.errors import RufusError
from rufus_data.yaml_config import StrictModel
from rufus_train.config import StageConfig
from rufus_train.stages.base import Stage, StageContext, conversational

TRL_DEFAULT_SERVER = "http://localhost:8000"


class DeviceRoles(StrictModel):
    """GPU ids (CUDA_VISIBLE_DEVICES style) of each role; trainer null = this process's CUDA_VISIBLE_DEVICES."""

    trainer: str | None = None
    server: str | None = Field(None, description="the vLLM server's GPUs (what `rufus-train serve --devices` got)")
    eval: str | None = Field(None, description="GPUs of checkpoint evaluation, if it runs beside training")


class GRPOStageConfig(StageConfig):
    """GRPO: learning rate 1e-6 full fine-tuning (TRL's default), 1e-5 with LoRA (about 10x)."""

    full_ft_learning_rate: ClassVar[float] = 1e-6
    lora_learning_rate: ClassVar[float] = 1e-5
    trl_config: ClassVar[str] = "rufus_train.dynamic_sampling.RufusGRPOConfig"
    trl_aliases: ClassVar[dict[str, str]] = {"rewards": "reward_weights", "vllm_server": "vllm_server_base_url"}

    rewards: list[str | dict[str, Any]] = Field(default_factory=list, description="reward specs (rewards registry)")
    num_generations: int = Field(8, ge=2, description="completions per prompt (the group)")
    max_completion_length: int = Field(512, ge=1)
    temperature: float = Field(1.0, gt=0)
    beta: float = Field(0.0, ge=0, description="KL coefficient to the reference (0: no reference model)")
    dynamic_sampling: Literal["mask", "resample"] | None = None
    dynamic_sampling_max_rounds: int = Field(4, ge=1)
    grpo_execution: Literal["sync", "async"] = "sync"
    vllm_server: str | None = Field(None, description="sync: generate on this vLLM server; async: the server (default :8000)")
    token_budget: int | None = Field(None, description="async: tokens per micro-batch row; null = server max_model_len")
    max_staleness: int = Field(4, ge=0, description="async: weight versions a rollout may lag before it is dropped")
    devices: DeviceRoles = Field(default_factory=DeviceRoles)
    accelerate_config: str | None = Field(None, description="the accelerate config the run is launched with")
    tools: list[Literal["calculator", "run_python"]] = Field(default_factory=list)
    environment: Literal["coding", "search"] | None = None
    search_index: str | None = Field(None, description="search environment: duckdb BM25 index file")
    search_corpus: str | None = Field(None, description="search environment: JSONL of {id, text} indexed into the run folder")
    max_tool_calling_iterations: int | None = Field(2, ge=0)
    reward_model: str | None = Field(None, description="sequence-classification checkpoint used as a reward")
    reward_model_weight: float = 1.0
    judge_url: str | None = Field(None, description="llm_judge rewards: OpenAI-compatible base URL of the judge (default: JUDGE_BASE_URL)")
    server_check_retries: int = Field(3, ge=1)

    @model_validator(mode="after")
    def _environment_needs(self) -> GRPOStageConfig:
        if self.environment == "search" and not (self.search_index or self.search_corpus):
            raise ValueError("environment: search needs search_index (a built index) or search_corpus (JSONL to index)")
        return self

    @property
    def server_url(self) -> str | None:
        if self.grpo_execution == "async":
            return self.vllm_server or TRL_DEFAULT_SERVER
        return self.vllm_server

    def reward_weights(self) -> list[float]:
        from rufus_data.rewards import parse_spec

        weights = [parse_spec(spec)[2] for spec in self.rewards]
        return weights + ([self.reward_model_weight] if self.reward_model else [])

    def trl_kwargs(self) -> dict[str, Any]:
        kwargs = {
            "num_generations": self.num_generations,
            "max_completion_length": self.max_completion_length,
            "temperature": self.temperature,
            "beta": self.beta,
            "reward_weights": self.reward_weights(),
            "dynamic_sampling": self.dynamic_sampling,
            "dynamic_sampling_max_rounds": self.dynamic_sampling_max_rounds,
            "max_tool_calling_iterations": self.max_tool_calling_iterations,
        }
        if self.vllm_server and self.grpo_execution == "sync":
            kwargs.update(use_vllm=True, vllm_mode="server", vllm_server_base_url=self.vllm_server)
        return kwargs


class GRPOStage(Stage):
    """Base of the GRPO stages; subclasses set name, description and config class."""

    config_class: ClassVar[type[StageConfig]] = GRPOStageConfig
    required_columns: ClassVar[tuple] = ("prompt",)

    # ------------------------------------------------------------------ before anything loads
    def check(self, config: GRPOStageConfig) -> None:
        from rufus_data.rewards import parse_spec
        from rufus_train import async_grpo

        if not config.rewards and not config.reward_model:
            raise RufusError(f"stage {config.stage} has no rewards: name at least one (e.g. rewards: ['string_match:gsm8k'])")
        for spec in config.rewards:
            parse_spec(spec)
        if config.reward_model:
            check_reward_model(config.reward_model)
        rows_per_step = config.per_device_train_batch_size * config.gradient_accumulation_steps
        if rows_per_step % config.num_generations:
            raise RufusError(
                f"per_device_train_batch_size x gradient_accumulation_steps ({rows_per_step}) must be a multiple of "
                f"num_generations ({config.num_generations}): each step holds whole prompt groups"
            )
        if config.grpo_execution == "async":
            async_grpo.validate_async_args(config)
        if config.server_url:
            trainer_devices = config.devices.trainer or os.environ.get("CUDA_VISIBLE_DEVICES")
            async_grpo.check_gpu_roles(trainer_devices, config.devices.server, config.devices.eval)
        context_limit(config, check=True)

    # ------------------------------------------------------------------ data
    def build_dataset(self, config: GRPOStageConfig, rows: pa.Table, tokenizer):
        from datasets import Dataset

        from rufus_train import async_grpo

        columns: dict[str, list] = {"prompt": conversational(rows, "prompt")}
        for name in rows.column_names:
            if name != "prompt":
                columns[name] = rows.column(name).to_pylist()
        if config.tools or config.environment or config.grpo_execution == "async":
            from rufus_train.tools import enable_tool_parsing

            enable_tool_parsing(tokenizer)  # async: TRL's rollout worker parses every completion with it
        tools = self.tool_schemas(config, Path(config.output_dir))
        longest = max(
            len(tokenizer.apply_chat_template(p, tools=tools or None, add_generation_prompt=True, tokenize=True,
                                              return_dict=False))
            for p in columns["prompt"]
        )
        limit, where = context_limit(config, check=False)
        if limit is not None:
            async_grpo.check_prompt_fits(longest, config.max_completion_length, limit, where)
        return Dataset.from_dict(columns)

    def tool_schemas(self, config: GRPOStageConfig, output_dir: Path) -> list:
        """The tools shown to the model (for prompt-length checks), as TRL will render them."""
        from rufus_train.tools import TOOLS, CodingEnvironment, SearchEnvironment

        tools = [TOOLS[name] for name in config.tools]
        if config.environment == "coding":
            probe = CodingEnvironment()
            tools += [probe.run_python, probe.run_tests]
        elif config.environment == "search":
            tools.append(SearchEnvironment(search_index_path(config, output_dir)).search)
        return tools

    # ------------------------------------------------------------------ trainer
    def reward_funcs(self, config: GRPOStageConfig) -> list:
        from rufus_data.models import resolve_model
        from rufus_data.rewards import build_rewards, parse_spec

        specs = list(config.rewards)
        if config.judge_url:  # the stage's judge_url reaches each llm_judge reward that names no base_url
            for i, spec in enumerate(specs):
                name, params, weight = parse_spec(spec)
                if name == "llm_judge" and "base_url" not in params:
                    specs[i] = {"name": name, **params, "weight": weight, "base_url": config.judge_url}
        funcs, _ = build_rewards(specs) if specs else ([], [])
        if config.reward_model:
            funcs.append(resolve_model(config.reward_model))  # TRL loads it as AutoModelForSequenceClassification
        return funcs

    def tool_kwargs(self, ctx: StageContext) -> dict:
        from rufus_train.tools import TOOLS, CodingEnvironment, search_environment_factory

        config: GRPOStageConfig = ctx.config
        kwargs: dict[str, Any] = {}
        if config.tools:
            kwargs["tools"] = [TOOLS[name] for name in config.tools]
        if config.environment == "coding":
            kwargs["environment_factory"] = CodingEnvironment
        elif config.environment == "search":
            kwargs["environment_factory"] = search_environment_factory(search_index_path(config, ctx.output_dir))
        return kwargs

    def make_trainer(self, ctx: StageContext):
        if ctx.config.grpo_execution == "async":
            return self.make_async_trainer(ctx)
        from rufus_train.dynamic_sampling import DynamicSamplingGRPOTrainer

        return DynamicSamplingGRPOTrainer(
            reward_funcs=self.reward_funcs(ctx.config),
            **ctx.trainer_kwargs(),
            **self.tool_kwargs(ctx),
        )

    def make_async_trainer(self, ctx: StageContext):  # pragma: no cover - needs CUDA and vllm (validate_async_args)
        from peft import LoraConfig
        from trl.experimental.async_grpo import AsyncGRPOTrainer

        from rufus_data.models import resolve_model
        from rufus_train import async_grpo

        config: GRPOStageConfig = ctx.config
        funcs = self.reward_funcs(config)
        tools = self.tool_kwargs(ctx)
        async_grpo.check_picklable(funcs, tools.get("tools"), tools.get("environment_factory"))
        args = async_config(ctx.args, config)
        if config.resume_from_checkpoint:
            async_grpo.read_rollout_state(config.resume_from_checkpoint, len(ctx.train_dataset))
        lora = config.lora
        peft_config = (
            LoraConfig(r=lora.r, lora_alpha=lora.lora_alpha, lora_dropout=lora.dropout,
                       target_modules=list(lora.target_modules), task_type="CAUSAL_LM")
            if lora.enabled else None
        )
        return AsyncGRPOTrainer(
            model=resolve_model(config.model),
            reward_funcs=funcs,
            args=args,
            train_dataset=ctx.train_dataset,
            processing_class=ctx.tokenizer,
            callbacks=ctx.callbacks,
            peft_config=peft_config,
            **tools,
        )


# TrainingArguments fields carried over from the stage's GRPO config to AsyncGRPOConfig.
SHARED_ASYNC_FIELDS = (
    "output_dir", "learning_rate", "max_steps", "num_train_epochs", "per_device_train_batch_size",
    "gradient_accumulation_steps", "seed", "report_to", "save_strategy", "save_steps", "logging_steps",
    "gradient_checkpointing", "bf16", "num_generations", "max_completion_length", "temperature",
    "max_tool_calling_iterations", "epsilon", "epsilon_high",
)


def async_config(args, config: GRPOStageConfig):
    """TRL's AsyncGRPOConfig from the stage's resolved GRPO config (runs on CPU: no CUDA needed)."""
    from trl.experimental.async_grpo import AsyncGRPOConfig

    fields = AsyncGRPOConfig.__dataclass_fields__
    return AsyncGRPOConfig(
        **{name: getattr(args, name) for name in SHARED_ASYNC_FIELDS if name in fields},
        vllm_server_base_url=config.server_url,
        token_budget=config.token_budget,  # null: TRL reads the server's max_model_len at train start
        max_staleness=config.max_staleness,
        dtype="bfloat16" if args.bf16 else "float32",
    )


def context_limit(config: GRPOStageConfig, check: bool) -> tuple[int | None, str]:
    """The context a prompt plus its completion must fit: the server's max_model_len when a server
    generates (asked with a few short retries; None = skipped), else the model's
    max_position_embeddings from its config.json. With check=True, also refuse a
    max_completion_length that leaves no room for any prompt."""
    from rufus_train import async_grpo

    url = config.server_url
    if url:
        if check:
            limit = async_grpo.check_completion_budget(
                url, config.max_completion_length, config.token_budget if config.grpo_execution == "async" else None,
                retries=config.server_check_retries,
            )
        else:
            from rufus_data.generate.context import server_max_model_len

            limit = server_max_model_len(url, retries=config.server_check_retries)
        return limit, f"the vLLM server's max_model_len at {url}"
    model_config = async_grpo.read_model_config(config.model)
    limit = model_config.get("max_position_embeddings")
    where = f"the model's max_position_embeddings ({config.model})"
    if check and limit is not None:
        from rufus_data.generate.context import check_fits

        check_fits(config.max_completion_length, limit, limit_name=where, max_tokens_name="max_completion_length")
    return limit, where


def check_reward_model(ref: str) -> None:
    """A local reward model must be a sequence-classification checkpoint (config.json says so)."""
    from rufus_train.async_grpo import read_model_config

    path = Path(ref).expanduser()
    if ref.startswith((".", "/", "~")) and not path.exists():
        raise RufusError(f"reward_model {ref} does not exist: give a sequence-classification checkpoint folder or hub id")
    architectures = read_model_config(ref).get("architectures") or []
    if path.exists() and architectures and not any(a.endswith("ForSequenceClassification") for a in architectures):
        raise RufusError(
            f"reward_model {ref} is a {architectures[0]}, not a sequence-classification checkpoint: train one with a "
            "reward-modelling stage, or use an llm_judge reward"
        )


def search_index_path(config: GRPOStageConfig, output_dir: Path) -> str:
    """The search index to use: the given one, or one built (once) from `search_corpus` into the run folder."""
    if config.search_index:
        if not Path(config.search_index).exists():
            raise RufusError(f"search_index {config.search_index} does not exist: build it, or give search_corpus")
        return config.search_index
    import json

    path = output_dir / "search_index.duckdb"
    if path.exists():
        return str(path)

    from rufus_train.search_index import build_index

    corpus = Path(config.search_corpus)
    if not corpus.exists():
        raise RufusError(f"search_corpus {corpus} does not exist: give a JSONL file of {{id, text}} documents")
    documents = [json.loads(line) for line in corpus.read_text().splitlines() if line.strip()]
    build_index(documents, path)
    console.print(f"search index: {len(documents)} documents from {corpus} -> {path}")
    return str(path)
