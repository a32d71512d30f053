"""`online_dpo`: DPO on pairs the policy writes while it trains (TRL's OnlineDPOTrainer, in
`trl.experimental.online_dpo` in TRL 1.16): for each prompt the policy samples two completions,
the stage's rewards score both (a verifier such as `string_match`, or the `llm_judge`), the
better one is the chosen answer, and the DPO loss is taken against the reference. The playbook's
light alternative to RL: one pair per prompt, no value model and no group of samples.

Rewards are named through the rewards registry as in the GRPO stages (weights summed; a `None`
reward counts as absent, never as 0). The reference model is the policy with its LoRA adapter
switched off; with full fine-tuning TRL keeps a frozen copy."""

from __future__ import annotations

import warnings
from typing import Any, ClassVar, Literal

import pyarrow as pa
from pydantic import Field

from rufus_data.base.errors import RufusError
from rufus_data.rewards import parse_spec
from rufus_train.config import StageConfig
from rufus_train.grpo.stage import stage_rewards
from rufus_train.stage_base import Stage, StageContext, conversational

VERIFIER_REWARD = {"name": "string_match", "extractor": "last_number", "gold_extractor": "gsm8k",
                   "answer_column": "expected_output"}


class OnlineDPOStageConfig(StageConfig):
    """Online DPO: DPO's learning rates (full 1e-6, LoRA 1e-5), beta 0.1."""

    full_ft_learning_rate: ClassVar[float] = 1e-6
    lora_learning_rate: ClassVar[float] = 1e-5
    trl_config: ClassVar[str] = "trl.experimental.online_dpo.OnlineDPOConfig"
    trl_aliases: ClassVar[dict[str, str]] = {"rewards": "reward_weights", "max_completion_length": "max_new_tokens"}

    max_length: int | None = Field(512, ge=8, description="prompt + completion tokens scored (prompt cut from the left)")
    rewards: list[str | dict[str, Any]] = Field(
        default_factory=lambda: [dict(VERIFIER_REWARD)], description="reward specs (rewards registry) that pick the chosen answer"
    )
    judge_url: str | None = Field(None, description="llm_judge rewards: OpenAI-compatible base URL (default: JUDGE_BASE_URL)")
    beta: float = Field(0.1, gt=0, description="strength of the pull toward the reference model")
    loss_type: Literal["sigmoid", "ipo"] = Field("sigmoid", description="sigmoid: the DPO loss; ipo: the IPO loss")
    max_completion_length: int = Field(64, ge=1, description="tokens sampled per completion (TRL's max_new_tokens)")
    temperature: float = Field(0.9, gt=0, description="sampling temperature of the two completions")
    missing_eos_penalty: float | None = Field(None, ge=0, description="subtracted from a completion that never ends")

    def trl_kwargs(self) -> dict[str, Any]:
        return {
            "max_length": self.max_length,
            "beta": [self.beta],
            "loss_type": self.loss_type,
            "max_new_tokens": self.max_completion_length,
            "temperature": self.temperature,
            "missing_eos_penalty": self.missing_eos_penalty,
            "reward_weights": [parse_spec(spec)[2] for spec in self.rewards],
            # TRL turns the KV cache off for sampling whenever gradient checkpointing is on (the stage
            # default); sampling runs without gradients, where transformers keeps the cache, and without it
            # every new token re-reads the whole sequence (a 2-step CPU run: 13 minutes). A user's
            # trainer.generation_kwargs merges over it (trl_args.trl_kwargs_for).
            "generation_kwargs": {"use_cache": True},
        }


class OnlineDPOStage(Stage):
    name = "online_dpo"
    description = "online DPO (trl.experimental OnlineDPOTrainer): the policy's own pairs, ranked by a verifier or judge"
    config_class = OnlineDPOStageConfig
    required_columns: ClassVar[tuple] = ("prompt",)

    def check(self, config: OnlineDPOStageConfig) -> None:
        if not config.rewards:
            raise RufusError("online_dpo ranks each pair by its rewards: name at least one (a verifier such as "
                             "string_match, or llm_judge with judge_url)")
        for spec in config.rewards:
            parse_spec(spec)
        if config.max_completion_length >= config.max_length:
            raise RufusError(f"online_dpo: max_completion_length ({config.max_completion_length}) leaves no room for "
                             f"the prompt in max_length ({config.max_length}): raise max_length")

    def build_dataset(self, config: OnlineDPOStageConfig, rows: pa.Table, tokenizer):
        from datasets import Dataset  # heavy: only when a run builds its dataset

        columns: dict[str, list] = {"prompt": conversational(rows, "prompt")}
        for name in rows.column_names:  # the rewards read their columns (expected_output, tests, ...)
            if name != "prompt":
                columns[name] = rows.column(name).to_pylist()
        return Dataset.from_dict(columns)

    def make_trainer(self, ctx: StageContext):
        config: OnlineDPOStageConfig = ctx.config
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # "experimental" notice, said in the docs
            from trl.experimental.online_dpo import OnlineDPOTrainer  # heavy: only when a run starts

            trainer = OnlineDPOTrainer(reward_funcs=stage_rewards(config.rewards, config.judge_url),
                                       **ctx.trainer_kwargs())
        if config.lora.enabled:
            # TRL copies a model that arrives already wrapped in its adapter as the reference; its own
            # LoRA path (ref_model None) scores the reference with the adapter switched off instead
            trainer.ref_model = None
        return trainer


STAGE = OnlineDPOStage()
