"""The keys every GRPO stage shares (`GRPOStageConfig`). The `trainer:` block of a GRPO stage is
checked against `RufusGRPOConfig` (TRL's GRPOConfig plus the dynamic-sampling settings). The GPU
ids of each role (`devices:`, with the server's) are every stage's (rufus_data/models/devices.py)."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field, field_validator, model_validator

from rufus_data.rewards import parse_spec
from rufus_train.config import StageConfig
from rufus_train.grpo.filter_settings import PromptFilter, filter_settings
from rufus_train.grpo.kl_penalty import estimator_name

TRL_DEFAULT_SERVER = "http://localhost:8000"
# adv_norm -> TRL's scale_rewards (the advantage is always the reward minus its group's mean)
ADV_NORM_TO_TRL = {"std": "group", "centered": "none", "batch_std": "batch"}
SHAPING_REWARDS = ("overlong_penalty",)  # score length, not correctness: a stage with only these has no reward


class GRPOStageConfig(StageConfig):
    """GRPO: learning rate 1e-6 full fine-tuning (TRL's default), 1e-5 with LoRA (about 10x)."""

    full_ft_learning_rate: ClassVar[float] = 1e-6
    lora_learning_rate: ClassVar[float] = 1e-5
    trl_config: ClassVar[str] = "rufus_train.grpo.dynamic_sampling.RufusGRPOConfig"
    max_length_unused_because: ClassVar[str | None] = (
        "what the model generates is capped by max_completion_length, and every prompt plus "
        "max_completion_length is checked against the context (the model's positions or the vLLM server's "
        "max_model_len) before training"
    )
    trl_aliases: ClassVar[dict[str, str]] = {
        "rewards": "reward_weights", "vllm_server": "vllm_server_base_url", "adv_norm": "scale_rewards",
    }
    generation_server: ClassVar[bool] = True
    progress_metrics: ClassVar[tuple[tuple[str, str, str | None], ...]] = (
        ("loss", "loss", None), ("reward", "reward", None), ("reward std", "reward_std", None),
        ("dead groups", "frac_reward_zero_std", "share"),
    )

    max_length: int | None = Field(None, description="not used by GRPO: refused (see max_length_unused_because)")
    logging_steps: int = Field(
        1, ge=1, description="optimizer steps between logged metrics: 1, so each step's rewards and dead-group share "
        "show (and are checked) as soon as it ends")
    stop_after_dead_steps: int | None = Field(
        3, ge=0, description="stop the run (exit 2, no model saved) after this many steps in a row whose prompt groups "
        "all had equal rewards (nothing to learn), or after every step of a shorter run; 0 or null: warn after each "
        "such step and train on")
    rewards: list[str | dict[str, Any]] = Field(default_factory=list, description="reward specs (rewards registry)")
    num_generations: int = Field(8, ge=2, description="completions per prompt (the group)")
    max_completion_length: int = Field(512, ge=1, description="tokens generated per completion at most (cut there)")
    temperature: float = Field(1.0, gt=0, description="sampling temperature of the rollouts")
    beta: float = Field(0.0, ge=0, description="KL coefficient to the reference (0: no reference model)")
    kl_estimator: Literal["k1", "k2", "k3"] = Field(
        "k3", description="with beta > 0: k3 = exp(-r) + r - 1 (TRL's), k2 = half the squared log-ratio r, k1 = r "
        "(Rufus's trainer); a name, never a number (Open Instruct's 2 is k3: kl_penalty.py)"
    )
    num_iterations: int = Field(1, ge=1, description="optimisation passes over each batch of rollouts (TRL's mu)")
    epsilon: float = Field(0.2, gt=0, description="clip of the importance ratio below: 1 - epsilon")
    epsilon_high: float | None = Field(None, gt=0, description="clip above: 1 + epsilon_high; null = epsilon (DAPO: 0.28)")
    adv_norm: Literal["std", "centered", "batch_std"] = Field(
        "std", description="advantage = reward - group mean, divided by the group std (std), by nothing (centered), "
        "or by the batch std (batch_std)"
    )
    dynamic_sampling: Literal["mask", "resample"] | None = Field(
        None, description="groups whose rewards are all equal: mask them, or resample (refills from a second prompt "
        "sampler: the run trains other prompts than one without it, so the two do not reproduce each other); sync "
        "GRPO only")
    dynamic_sampling_max_rounds: int = Field(
        4, ge=1, description="resample: refill rounds per batch before it is topped up with groups that teach nothing")
    grpo_execution: Literal["sync", "async"] = Field(
        "sync", description="sync: TRL's GRPOTrainer, generation then training; async: AsyncGRPOTrainer, rollouts "
        "from a vLLM server (vllm_server) while it trains")
    vllm_server: str | None = Field(None, description="sync: generate on this vLLM server; async: the server (default :8000)")
    token_budget: int | None = Field(
        None, description="async: tokens per micro-batch row (must hold the longest prompt + max_completion_length); "
        "null = server max_model_len; <= 0: fixed per_device_train_batch_size rows instead"
    )
    max_staleness: int = Field(4, ge=0, description="async: weight versions a rollout may lag before it is dropped")
    weight_sync_steps: int = Field(1, ge=1, description="async: training steps between weight pushes to the vLLM server")
    max_inflight_tasks: int = Field(
        -1, description="async: generation requests in flight; -1 = max_staleness x batch x accumulation x processes"
    )
    queue_maxsize: int = Field(1024, ge=1, description="async: rollout samples buffered between worker and trainer")
    request_timeout: int = Field(600, ge=1, description="async: seconds per HTTP request to the vLLM server")
    weight_sync_timeout: int = Field(1800, ge=1, description="async: seconds a weight transfer may take before it raises")
    heartbeat_stale_after_s: float = Field(300.0, gt=0, description="async: seconds of rollout-worker silence before abort")
    fork_threshold_tokens: int = Field(
        1024, ge=0, description="async multi-turn: a re-tokenization drift of more trained tokens forks a new row"
    )
    tools: list[Literal["calculator", "run_python"]] = Field(
        default_factory=list, description="tools the model may call in its rollouts: calculator (exact arithmetic), "
        "run_python (sandboxed code, returns what it prints)")
    environment: Literal["coding", "search"] | None = Field(
        None, description="a tool environment per rollout: coding (run_python and run_tests against the row's tests), "
        "search (a BM25 index: search_index or search_corpus)")
    search_index: str | None = Field(None, description="search environment: duckdb BM25 index file")
    search_corpus: str | None = Field(
        None, description="search environment: documents indexed into the run folder: a JSONL or parquet file, or a "
        "folder of them (a Wikipedia dump)"
    )
    search_text_fields: list[str] | None = Field(
        None, description="fields of a corpus record joined into the document's text (null: title and text when the "
        "record has a text, else every string field but the id)"
    )
    search_passage_words: int | None = Field(None, ge=10, description="cut documents into passages of N words (null: whole)")
    search_top_k: int = Field(3, ge=1, description="documents a search call returns")
    max_tool_calling_iterations: int | None = Field(
        2, ge=0, description="tool-calling turns per completion at most; null: until a reply calls no tool")
    reward_model: str | None = Field(None, description="sequence-classification checkpoint used as a reward")
    reward_model_weight: float = Field(1.0, description="weight of reward_model's score among the rewards' weights")
    judge_url: str | None = Field(None, description="llm_judge rewards: OpenAI-compatible base URL of the judge (default: JUDGE_BASE_URL)")
    filter: PromptFilter | None = Field(
        None, description="before training, sample k completions of the starting model per prompt (rufus-data filter) "
        "and train only on the learnable ones (null: train on the data as given; true: the defaults)")
    server_check_retries: int = Field(
        3, ge=1, description="sync with vllm_server: attempts at reading its max_model_len for the context check "
        "(no answer: the check is skipped)")

    @field_validator("filter", mode="before")
    @classmethod
    def _filter_switch(cls, value: Any) -> Any:
        return filter_settings(value)

    @model_validator(mode="after")
    def _filter_samples_as_the_stage(self) -> GRPOStageConfig:
        """The filter samples as the stage will (its completion length and temperature) unless it says otherwise."""
        if self.filter is not None:
            if self.filter.max_tokens is None:
                object.__setattr__(self.filter, "max_tokens", self.max_completion_length)
            if self.filter.temperature is None:
                object.__setattr__(self.filter, "temperature", self.temperature)
        return self

    @field_validator("kl_estimator", mode="before")
    @classmethod
    def _kl_estimator_named(cls, value: Any) -> Any:
        return estimator_name(value)

    @model_validator(mode="after")
    def _reward_model_weight_needs_model(self) -> GRPOStageConfig:
        if self.reward_model is None and self.reward_model_weight != 1.0:
            raise ValueError(
                f"reward_model_weight ({self.reward_model_weight}) is set but no reward_model is: the weight would "
                "apply to nothing. Give reward_model, or remove reward_model_weight"
            )
        return self

    @model_validator(mode="after")
    def _environment_needs(self) -> GRPOStageConfig:
        if self.environment == "search" and not (self.search_index or self.search_corpus):
            raise ValueError("environment: search needs search_index (a built index) or search_corpus (documents to index)")
        return self

    @property
    def server_url(self) -> str | None:
        if self.grpo_execution == "async":
            return self.vllm_server or TRL_DEFAULT_SERVER
        return self.vllm_server

    def reward_weights(self) -> list[float]:
        weights = [parse_spec(spec)[2] for spec in self.rewards]
        return weights + ([self.reward_model_weight] if self.reward_model else [])

    def trl_kwargs(self) -> dict[str, Any]:
        kwargs = {
            "num_generations": self.num_generations,
            "max_completion_length": self.max_completion_length,
            "temperature": self.temperature,
            "beta": self.beta,
            "kl_estimator": self.kl_estimator,
            "num_iterations": self.num_iterations,
            "epsilon": self.epsilon,
            "epsilon_high": self.epsilon_high,
            "scale_rewards": ADV_NORM_TO_TRL[self.adv_norm],
            "reward_weights": self.reward_weights(),
            "dynamic_sampling": self.dynamic_sampling,
            "dynamic_sampling_max_rounds": self.dynamic_sampling_max_rounds,
            "max_tool_calling_iterations": self.max_tool_calling_iterations,
        }
        if self.vllm_server and self.grpo_execution == "sync":
            kwargs.update(use_vllm=True, vllm_mode="server", vllm_server_base_url=self.vllm_server)
        return kwargs
