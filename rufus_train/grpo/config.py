"""The keys every GRPO stage shares (`GRPOStageConfig`) and the GPU ids of each role
(`DeviceRoles`). The `trainer:` block of a GRPO stage is checked against
`RufusGRPOConfig` (TRL's GRPOConfig plus the dynamic-sampling settings)."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field, model_validator

from rufus_data.rewards import parse_spec
from rufus_data.yaml_config import StrictModel
from rufus_train.config import StageConfig

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
    trl_config: ClassVar[str] = "rufus_train.grpo.dynamic_sampling.RufusGRPOConfig"
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
