"""TRL's AsyncGRPOConfig from a GRPO stage config: every setting reaches the async trainer, or
the run is refused before anything loads, naming the setting.

The settings a stage passes to TRL are the ones its sync run would pass (`trl_request`: the
TrainingArguments every stage sets, the stage's GRPO keys and the `trainer:` block, as
rufus_train/trl_args.py builds them), plus the async-only keys of the stage (ASYNC_KEYS). Each one:
- has a field of the same name in the installed TRL's AsyncGRPOConfig: passed as it is
  (learning rate, steps, batch, temperature, epsilon, `trainer.top_p`, `trainer.top_k`,
  `trainer.min_p`, `trainer.repetition_penalty`, ...);
- is `reward_weights` (the rewards' `weight`s and `reward_model_weight`): AsyncGRPOTrainer sums
  its rewards with weight 1, so each reward function with a weight other than 1 is wrapped to
  multiply its scores (`WeightedReward`): the same weighted sum the sync trainer computes;
- is a sync-only setting at its idle value (IDLE: `beta: 0`, one inner epoch, the group-std
  advantage TRL's async worker computes): nothing is lost, so nothing is said;
- anything else (a KL term, inner epochs, another advantage scaling, a `trainer:` key the async
  config has no field for): refused, one message per setting.
Dynamic sampling and evaluation have their own messages in async_checks.py."""

from __future__ import annotations

import dataclasses
import inspect
from pathlib import Path
from typing import Any

from rufus_train import modeling
from rufus_train.grpo.config import GRPOStageConfig
from rufus_train.trl_args import trl_kwargs_for

# stage keys that exist only for async GRPO, each the AsyncGRPOConfig field of the same name
ASYNC_KEYS = (
    "token_budget", "max_staleness", "weight_sync_steps", "max_inflight_tasks", "queue_maxsize", "request_timeout",
    "weight_sync_timeout", "heartbeat_stale_after_s", "fork_threshold_tokens",
)
# sync GRPO settings the async trainer has no field for: the value under which it behaves the same,
# and what it does instead
IDLE = {
    "beta": (0.0, "it has no KL term (beta: 0)"),
    "num_iterations": (1, "it makes one optimisation pass per batch of rollouts (num_iterations: 1)"),
    "scale_rewards": ("group", "its advantage is always divided by the group's std (adv_norm: std)"),
}
# settings that matter only beside another one: (the other one, its idle value)
DEPENDENT = {"kl_estimator": ("beta", 0.0), "dynamic_sampling_max_rounds": ("dynamic_sampling", None)}
# reported by async_checks.async_problems with their own reason
CHECKED_ELSEWHERE = ("dynamic_sampling",)
APPLIED_BY_WRAPPING = ("reward_weights",)


def async_fields() -> dict[str, dataclasses.Field]:
    # heavy: TRL loads only when an async GRPO stage is checked
    from trl.experimental.async_grpo import AsyncGRPOConfig

    return {f.name: f for f in dataclasses.fields(AsyncGRPOConfig)}


def trl_request(config: GRPOStageConfig) -> dict[str, Any]:
    """What the stage asks TRL for, as its sync run passes it."""
    return trl_kwargs_for(config, Path(config.output_dir))


def setting_name(config: GRPOStageConfig, key: str) -> str:
    """The name the user wrote: `trainer.KEY`, or the stage key a TRL field comes from."""
    if key in config.trainer:
        return f"trainer.{key}"
    return next((mine for mine, trl in type(config).trl_aliases.items() if trl == key), key)


def async_setting_problems(config: GRPOStageConfig) -> list[str]:
    """Every setting the async trainer would drop, one message each (nothing loads)."""
    fields = async_fields()
    request = trl_request(config)
    problems = []
    for key, value in request.items():
        if key in fields or key in APPLIED_BY_WRAPPING or key in CHECKED_ELSEWHERE:
            continue
        if key in IDLE and value == IDLE[key][0] and key not in config.trainer:
            continue
        if key in DEPENDENT:
            other, idle = DEPENDENT[key]
            if request.get(other, idle) == idle and key not in config.trainer:
                continue  # the setting it modifies is off
        name = setting_name(config, key)
        shown = getattr(config, name) if hasattr(config, name) else value
        instead = IDLE[key][1] if key in IDLE else "it would ignore the setting"
        problems.append(
            f"(trl) {name}: {shown!r}: TRL's AsyncGRPOConfig has no such field and {instead}. Remove it, or use "
            "grpo_execution: sync"
        )
    return problems


def async_config_kwargs(config: GRPOStageConfig) -> dict[str, Any]:
    """The AsyncGRPOConfig keyword arguments of a stage (its problems refused first by the stage's check)."""
    fields = async_fields()
    kwargs = {key: value for key, value in trl_request(config).items() if key in fields}
    kwargs.update({key: getattr(config, key) for key in ASYNC_KEYS})
    kwargs["vllm_server_base_url"] = config.server_url
    # the weights' dtype, as every stage loads them (modeling.precision): under `auto` on a bf16 GPU full
    # fine-tuning keeps fp32 master weights and computes under the trainer's bf16 autocast (TRL's own
    # default: dtype float32, bf16 on), LoRA keeps its frozen base in bf16
    kwargs["dtype"] = modeling.precision(config.dtype, full_finetune=not config.lora.enabled).dtype
    return kwargs


def async_config(config: GRPOStageConfig):
    """TRL's AsyncGRPOConfig for the stage (builds on CPU: no CUDA needed)."""
    from trl.experimental.async_grpo import AsyncGRPOConfig  # heavy: only when an async run starts

    return AsyncGRPOConfig(**async_config_kwargs(config))


class WeightedReward:
    """A reward function whose scores are multiplied by its weight (a None score stays None):
    AsyncGRPOTrainer sums rewards with weight 1. Picklable when the function is (the rollout
    worker is a spawned process); TRL logs it under the function's own name."""

    def __init__(self, func, weight: float):
        self.func = func
        self.weight = weight
        self.__name__ = getattr(func, "__name__", type(func).__name__)

    def __call__(self, **kwargs):
        return [None if score is None else score * self.weight for score in self.func(**kwargs)]


class AsyncWeightedReward(WeightedReward):
    """WeightedReward of an async reward function (the LLM judge): TRL awaits what is async."""

    async def __call__(self, **kwargs):
        return [None if score is None else score * self.weight for score in await self.func(**kwargs)]


def weighted_rewards(funcs: list, weights: list[float]) -> list:
    """The reward functions with their weights applied (weight 1: the function itself)."""
    out = []
    for func, weight in zip(funcs, weights, strict=True):
        if weight == 1.0:
            out.append(func)
        elif inspect.iscoroutinefunction(func) or inspect.iscoroutinefunction(type(func).__call__):
            out.append(AsyncWeightedReward(func, weight))
        else:
            out.append(WeightedReward(func, weight))
    return out
