"""The GRPO stage every GRPO-based stage subclasses: the checks that run before anything loads,
the dataset of prompts, and the trainer (Rufus's dynamic-sampling GRPOTrainer, or TRL's
AsyncGRPOTrainer against a vLLM server with `grpo_execution: async`). Its keys are in config.py.

Rewards are named through the rewards registry (`rewards: ["string_match:gsm8k", {name: ...,
weight: 0.5}]`), their weights become TRL's `reward_weights`. A stage given none (`rewards: []`,
or only the length-shaping overlong penalty) scores each row with its own source's reward, which
travels with the data (rufus_data/rewards/data_rewards.py). Generation runs in the trainer
(transformers) by default, on a vLLM server with `vllm_server: URL` (sync server mode), or
asynchronously. Before the tokenizer, dataset or model load, `check` reads the context limit
(the server's max_model_len, else the model's max_position_embeddings) and refuses a
`max_completion_length` that cannot fit; once the prompts are tokenized the longest prompt plus
`max_completion_length` is checked too (vLLM would cut it silently)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

import pyarrow as pa

from rufus_data.base.catalog_files import docs_page
from rufus_data.base.console import console
from rufus_data.base.errors import RufusError
from rufus_data.models.builtin import read_model_config
from rufus_data.models.reference import ModelRef
from rufus_data.rewards import build_rewards, parse_spec
from rufus_data.rewards.data_rewards import REWARD_COLUMN, data_reward_specs
from rufus_train.config import StageConfig
from rufus_train.data import columns_of
from rufus_train.grpo.async_checks import check_picklable, validate_async_args
from rufus_train.grpo.async_config import async_config, weighted_rewards
from rufus_train.grpo.config import SHAPING_REWARDS, GRPOStageConfig
from rufus_train.grpo.filter_settings import check_prompt_filter
from rufus_train.grpo.kl_penalty import kl_estimator_problems
from rufus_train.grpo.length_checks import check_prompt_fits, check_token_budget, context_limit
from rufus_train.grpo.rollout_state import read_rollout_state
from rufus_train.grpo.search_index import SearchIndex, build_index, read_corpus
from rufus_train.grpo.tools import (
    TOOLS,
    CodingEnvironment,
    SearchEnvironment,
    enable_tool_parsing,
    search_environment_factory,
)
from rufus_train.launch import on_main_process
from rufus_train.stage_base import Stage, StageContext, conversational


class GRPOStage(Stage):
    """Base of the GRPO stages; subclasses set name, description and config class."""

    config_class: ClassVar[type[StageConfig]] = GRPOStageConfig
    required_columns: ClassVar[tuple] = ("prompt",)

    # ------------------------------------------------------------------ before anything loads
    def check(self, config: GRPOStageConfig) -> None:
        if uses_data_rewards(config) and not all(REWARD_COLUMN in columns_of(entry) for entry in config.data):
            raise RufusError(f"stage {config.stage} has no rewards: name at least one (e.g. rewards: ['string_match:gsm8k']), "
                             f"or train on data whose catalog sources declare `reward:` ({docs_page('filter.md')})")
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
        problems = kl_estimator_problems(config)
        if problems:
            raise RufusError(f"stage {config.stage}: " + "; ".join(problems))
        if config.grpo_execution == "async":
            validate_async_args(config)  # every setting reaches AsyncGRPOConfig or is refused here (async_config.py)
        context_limit(config, check=True)
        if config.filter is not None:
            check_prompt_filter(config)

    # ------------------------------------------------------------------ data
    def build_dataset(self, config: GRPOStageConfig, rows: pa.Table, tokenizer):
        from datasets import Dataset  # heavy: only when a run builds its dataset

        if uses_data_rewards(config):  # before the TRL arguments (reward_weights) and the reward functions
            specs = data_reward_specs(rows.select(["label", REWARD_COLUMN]).to_pylist())
            object.__setattr__(config, "rewards", [*specs, *config.rewards])
            named = ", ".join(f"{spec['name']}@{spec['only_label']}" for spec in specs)
            console.print(f"stage {config.stage}: each row is scored by its source's reward (from the data): {named}",
                          highlight=False)
        columns: dict[str, list] = {"prompt": conversational(rows, "prompt")}
        for name in rows.column_names:
            if name != "prompt":
                columns[name] = rows.column(name).to_pylist()
        if config.tools or config.environment or config.grpo_execution == "async":
            enable_tool_parsing(tokenizer)  # async: TRL's rollout worker parses every completion with it
        longest = longest_prompt_tokens(columns["prompt"], tokenizer, self.tool_schemas(config, Path(config.output_dir)))
        limit, where = context_limit(config, check=False)
        if limit is not None:
            check_prompt_fits(longest, config.max_completion_length, limit, where)
        if config.grpo_execution == "async":
            check_token_budget(longest, config.max_completion_length, config.token_budget)
        return Dataset.from_dict(columns)

    def tool_schemas(self, config: GRPOStageConfig, output_dir: Path) -> list:
        """The tools shown to the model (for prompt-length checks), as TRL will render them."""
        tools = [TOOLS[name] for name in config.tools]
        if config.environment == "coding":
            probe = CodingEnvironment()
            tools += [probe.run_python, probe.run_tests]
        elif config.environment == "search":
            tools.append(SearchEnvironment(search_index_path(config, output_dir), config.search_top_k).search)
        return tools

    # ------------------------------------------------------------------ trainer
    def reward_funcs(self, config: GRPOStageConfig) -> list:
        funcs = stage_rewards(config.rewards, config.judge_url)
        if config.reward_model:
            funcs.append(ModelRef.of(config.reward_model).folder())  # TRL loads it as AutoModelForSequenceClassification
        return funcs

    def tool_kwargs(self, ctx: StageContext) -> dict:
        config: GRPOStageConfig = ctx.config
        kwargs: dict[str, Any] = {}
        if config.tools:
            kwargs["tools"] = [TOOLS[name] for name in config.tools]
        if config.environment == "coding":
            kwargs["environment_factory"] = CodingEnvironment
        elif config.environment == "search":
            kwargs["environment_factory"] = search_environment_factory(search_index_path(config, ctx.output_dir),
                                                                       config.search_top_k)
        return kwargs

    def watch(self, config: GRPOStageConfig):
        # transformers loads with it: only when a run starts
        from rufus_train.grpo.dead_groups import DeadGroupWatch

        return DeadGroupWatch(config.stage, config.model, config.data, config.stop_after_dead_steps)

    def make_trainer(self, ctx: StageContext):
        if ctx.config.grpo_execution == "async":
            return self.make_async_trainer(ctx)
        # torch and TRL's trainer load with it: only when a run starts
        from rufus_train.grpo.trainer import RufusGRPOTrainer

        return RufusGRPOTrainer(
            reward_funcs=self.reward_funcs(ctx.config),
            **ctx.trainer_kwargs(),
            **self.tool_kwargs(ctx),
        )

    def make_async_trainer(self, ctx: StageContext):  # pragma: no cover - needs CUDA and vllm (validate_async_args)
        from peft import LoraConfig  # heavy: only when an async run starts

        from rufus_train.grpo.async_trainer import RufusAsyncGRPOTrainer

        config: GRPOStageConfig = ctx.config
        funcs = self.reward_funcs(config)
        tools = self.tool_kwargs(ctx)
        check_picklable(funcs, tools.get("tools"), tools.get("environment_factory"))
        funcs = weighted_rewards(funcs, config.reward_weights())  # async sums rewards with weight 1
        args = async_config(config)
        if config.resume_from_checkpoint:
            read_rollout_state(config.resume_from_checkpoint, len(ctx.train_dataset))
        lora = config.lora
        peft_config = (
            LoraConfig(r=lora.r, lora_alpha=lora.lora_alpha, lora_dropout=lora.dropout,
                       target_modules=list(lora.target_modules), task_type="CAUSAL_LM")
            if lora.enabled else None
        )
        return RufusAsyncGRPOTrainer(
            longest_prompt=lambda: longest_prompt_tokens(ctx.train_dataset["prompt"], ctx.tokenizer,
                                                         self.tool_schemas(config, ctx.output_dir)),
            model=ModelRef.of(config.model).folder(),
            reward_funcs=funcs,
            args=args,
            train_dataset=ctx.train_dataset,
            processing_class=ctx.tokenizer,
            callbacks=ctx.callbacks,
            peft_config=peft_config,
            **tools,
        )


def longest_prompt_tokens(prompts: list, tokenizer, tools: list) -> int:
    """The longest prompt in tokens, rendered as TRL renders it (chat template, tools, generation prompt)."""
    return max(
        len(tokenizer.apply_chat_template(p, tools=tools or None, add_generation_prompt=True, tokenize=True,
                                          return_dict=False))
        for p in prompts
    )


def stage_rewards(specs: list, judge_url: str | None) -> list:
    """The reward functions of a stage's specs; the stage's judge_url reaches each llm_judge reward
    that names no base_url (GRPO stages and online DPO)."""
    specs = list(specs)
    if judge_url:
        for i, spec in enumerate(specs):
            name, params, weight = parse_spec(spec)
            if name == "llm_judge" and "base_url" not in params:
                specs[i] = {"name": name, **params, "weight": weight, "base_url": judge_url}
    return build_rewards(specs)[0] if specs else []


def uses_data_rewards(config: GRPOStageConfig) -> bool:
    """True when the stage names no reward of its own (none, or only shaping ones) and no reward
    model: each row is then scored by its source's reward, which the data carries."""
    return not config.reward_model and all(parse_spec(spec)[0] in SHAPING_REWARDS for spec in config.rewards)


def check_reward_model(ref: str) -> None:
    """A local reward model must be a sequence-classification checkpoint (config.json says so)."""
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
    """The search index to use: the given one, or one built (once) from `search_corpus` into the run
    folder, by one process when there are several (the others wait for it)."""
    return on_main_process(_search_index_path, config, output_dir)


def _search_index_path(config: GRPOStageConfig, output_dir: Path) -> str:
    if config.search_index:
        if not Path(config.search_index).exists():
            raise RufusError(f"search_index {config.search_index} does not exist: build it, or give search_corpus")
        return config.search_index
    path = output_dir / "search_index.duckdb"
    if path.exists():
        return str(path)
    documents = read_corpus(config.search_corpus, config.search_text_fields, passage_words=config.search_passage_words)
    build_index(documents, path)
    index = SearchIndex(path)
    console.print(f"search index: {index.size():,} documents from {config.search_corpus} -> {path}")
    index.close()
    return str(path)
