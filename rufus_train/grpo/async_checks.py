"""Async GRPO (TRL's AsyncGRPOTrainer against a separate vLLM server): every configuration that
path cannot run is refused before anything loads, one message per problem.

Each rule names where it comes from: `(trl)` for what the installed TRL 1.16
(`trl/experimental/async_grpo/`) cannot do, `(rufus)` for what Rufus adds around it. The
recipe's original list (DeepSpeed, FSDP, more than one process, evaluation, dynamic sampling,
quantized models, PEFT, a reward model on a local GPU) was re-checked against that source:

- DeepSpeed: refused (trl) (the trainer is FSDP2-only; weight sync streams whole parameters or
  FSDP2 DTensors, never ZeRO partitions).
- FSDP: FSDP1 refused, FSDP2 allowed (trl) (`_streaming_iter` all-gathers DTensors only).
- More than one training process: allowed (trl) (the batchers pack one row per data-parallel rank).
- Evaluation: refused (trl) (AsyncGRPOTrainer takes no eval dataset).
- Dynamic sampling: refused (rufus) (it lives in Rufus's GRPOTrainer subclass; the async worker
  scores in its own process).
- Quantized models: refused (trl) (no quantization_config; merged-weight sync cannot stream
  quantized tensors).
- PEFT: LoRA allowed (trl) (adapter sync when the server runs `--enable-lora`, else merged
  weights); adapters on the head or the embeddings refused (trl) (the fused log-prob head reads
  the base weight, and vLLM drops head deltas from logprobs).
- Reward model on a local GPU: refused (trl) (the rollout worker is spawned with
  CUDA_VISIBLE_DEVICES="", so a sequence-classification reward model would run on CPU).
- Added (trl): CUDA present, vllm and aiohttp importable in the trainer's environment, the
  `kernels` package for the FlashAttention-3 tree-attention kernel it packs with (fetched from
  the Hub on first use: attention_kernel.py), no Liger kernel, attention-only architectures, picklable rewards.
- Every stage setting the async config has no field for (async_config.py): refused by name.
- Warned, not refused: a `token_budget` without room for two completions of `max_completion_length` costs
  throughput, not correctness (the recipe measured 7 groups in 12 steps against 11).

The checks every GRPO run shares sit beside this module: length_checks.py (completion length
against the server's `max_model_len`) and rollout_state.py (the async resume position); the
GPU roles are every stage's (rufus_data/models/devices.py). The vLLM server async GRPO needs is started by `rufus-train serve`
(rufus_train/serve.py)."""

from __future__ import annotations

import importlib.util
import os
import pickle
import sys
import warnings

from rufus_data.base.console import console
from rufus_data.base.errors import RufusError
from rufus_data.base.yaml_config import load_yaml_text
from rufus_data.models.builtin import read_model_config
from rufus_data.models.devices import gpu_ids
from rufus_train.grpo.async_config import async_setting_problems
from rufus_train.grpo.attention_kernel import CUDA_KERNEL, cached_kernel, kernels_missing
from rufus_train.launch import accelerate_config_path

TREE_ATTENTION_KERNEL = CUDA_KERNEL[0]
QUANTIZATION_KEYS = ("quantization_config", "load_in_4bit", "load_in_8bit")
HEAD_AND_EMBEDDINGS = ("lm_head", "embed_tokens", "embed_out", "wte", "word_embeddings")


# ------------------------------------------------------------------------------ validation


def async_problems(config, environ: dict | None = None) -> list[str]:
    """Every reason the AsyncGRPOTrainer path cannot run `config` (a GRPO stage config), one string each."""
    env = dict(os.environ if environ is None else environ)
    problems: list[str] = []
    problems += _environment_problems(env, named_gpus(config))
    problems += _distributed_problems(config, env)
    trainer = dict(getattr(config, "trainer", {}) or {})
    eval_strategy = str(trainer.get("eval_strategy", "no")).lower()
    if eval_strategy != "no" or trainer.get("do_eval"):
        problems.append(
            "(trl) evaluation during training: AsyncGRPOTrainer takes no eval dataset. Remove trainer.eval_strategy/"
            "do_eval and evaluate checkpoints with rufus-eval on their own devices"
        )
    if getattr(config, "dynamic_sampling", None):
        problems.append(
            f"(rufus) dynamic_sampling: {config.dynamic_sampling} is a synchronous-GRPO feature (the async rollout "
            "worker scores groups in its own process and queues them as they finish), and async GRPO has no other "
            "remedy for dead groups (every completion of a prompt earning the same reward: no advantage, no "
            "gradient). Filter the prompts first, `rufus-data filter DATA --policy MODEL --out learnable` (keeps "
            "the prompts the policy neither always solves nor always fails), train on `--data learnable` with "
            "dynamic_sampling: null; or grpo_execution: sync"
        )
    if trainer.get("use_liger_kernel"):
        problems.append("(trl) use_liger_kernel: AsyncGRPOTrainer raises NotImplementedError for it; remove it")
    problems += _model_problems(config, trainer)
    problems += _lora_problems(config)
    problems += async_setting_problems(config)
    if getattr(config, "reward_model", None):
        problems.append(
            f"(trl) reward_model {config.reward_model}: the async rollout worker runs in a child process started with "
            "CUDA_VISIBLE_DEVICES='', so a sequence-classification reward model would score on CPU. Use the LLM "
            "judge on its own server (rewards: [{name: llm_judge, ...}]) or grpo_execution: sync"
        )
    return problems


def token_budget_warning(config) -> str | None:
    """A set `token_budget` that cannot hold two completions of `max_completion_length` with their
    prompts per micro-batch row: every row trains one sample, so each step covers part of a group. Slower, not
    wrong (the seed measured it), so a warning, never a refusal."""
    budget, longest = getattr(config, "token_budget", None), config.max_completion_length
    if budget is None or budget <= 0 or budget > 2 * longest:
        return None
    return (
        f"token_budget {budget} holds one completion of max_completion_length {longest} (plus its prompt) per "
        "micro-batch row, so each step trains few samples: a small budget costs throughput, not correctness. The "
        "recipe measured it (seed 000): token_budget 4096 with 2048-token completions trained 7 groups in 12 "
        "steps; with the server's context at 16384 and token_budget null, the same 12 steps trained 11. Leave "
        f"token_budget null (the server's max_model_len) or set it above {2 * longest} (two completions a row) by "
        "at least two prompts' length"
    )


def validate_async_args(config, environ: dict | None = None) -> None:
    """Raise one RufusError listing every problem of `config` for async GRPO (nothing loads);
    first warn about what only slows it (token_budget_warning)."""
    slow = token_budget_warning(config)
    if slow:
        console.print(f"[bold yellow]warning:[/] {slow}", highlight=False, soft_wrap=True)
        warnings.warn(slow, UserWarning, stacklevel=2)
    problems = async_problems(config, environ)
    if problems:
        raise RufusError(
            f"grpo_execution: async cannot run this {getattr(config, 'stage', 'GRPO')} config "
            f"({len(problems)} problem{'s' if len(problems) > 1 else ''}):\n- " + "\n- ".join(problems)
        )


def named_gpus(config) -> str:
    """The GPUs the config's roles name, as a clause for a message ('' when none are named)."""
    roles = getattr(config, "devices", None)
    named = [f"{role} GPU {','.join(gpu_ids(getattr(roles, role)))}" for role in ("trainer", "server")
             if roles is not None and gpu_ids(getattr(roles, role))]
    return f" This config places the {' and the '.join(named)} (devices)." if named else ""


def _environment_problems(env: dict, wanted: str = "") -> list[str]:
    problems = []
    import torch  # heavy: only when an async run is checked

    if not torch.cuda.is_available():
        problems.append(
            "(trl) no CUDA GPU is visible to the trainer: async GRPO packs rollouts with a FlashAttention-3 kernel "
            f"and pushes weights to vLLM over NCCL, both CUDA-only.{wanted} Run on a GPU machine, or use "
            "grpo_execution: sync"
        )
    elif not torch.version.hip and torch.cuda.get_device_capability()[0] < 8:
        name = torch.cuda.get_device_name()
        problems.append(f"(trl) {name} is older than Ampere: the FlashAttention-3 tree-attention kernel needs sm_80+")
    if importlib.util.find_spec("vllm") is None:
        problems.append(
            f"(trl) vllm is not importable in the trainer's environment ({sys.executable}): the async rollout "
            "worker and the NCCL weight-transfer client import it. `pip install vllm` in this "
            "environment; the server itself may run elsewhere"
        )
    if importlib.util.find_spec("aiohttp") is None:
        problems.append("(trl) aiohttp is not installed: the async rollout worker talks to vLLM with it (`pip install aiohttp`)")
    missing = kernels_missing()
    if missing:
        problems.append(f"(trl) async GRPO's tree attention loads {TREE_ATTENTION_KERNEL} through `kernels`, and {missing}")
    elif env.get("HF_HUB_OFFLINE") == "1" and torch.cuda.is_available() and cached_kernel() is None:
        problems.append(
            f"(trl) HF_HUB_OFFLINE=1 but {TREE_ATTENTION_KERNEL} is not cached for this machine: the tree-attention "
            "kernel is downloaded on first use. Run `rufus-train prefetch` once while online, or unset HF_HUB_OFFLINE"
        )
    return problems


def _distributed_problems(config, env: dict) -> list[str]:
    """DeepSpeed and FSDP1 from the accelerate launch environment or the stage's accelerate config file."""
    problems = []
    launch = accelerate_settings(getattr(config, "accelerate_config", None), env)
    if launch["deepspeed"]:
        problems.append(
            "(trl) DeepSpeed: AsyncGRPOTrainer is FSDP2-only (weight sync streams whole parameters or FSDP2 DTensors, "
            "never ZeRO partitions). Launch with catalogs/accelerate/fsdp2.yaml (or DDP), or use grpo_execution: sync"
        )
    if launch["fsdp"] and launch["fsdp_version"] != 2:
        problems.append(
            "(trl) FSDP version 1: async weight sync all-gathers FSDP2 DTensors only. Set fsdp_version: 2 "
            "(catalogs/accelerate/fsdp2.yaml)"
        )
    return problems


def accelerate_settings(config_file: str | None, env: dict) -> dict:
    """What `accelerate launch` will run: from its environment variables, else from the config file."""
    settings = {
        "deepspeed": env.get("ACCELERATE_USE_DEEPSPEED", "").lower() == "true",
        "fsdp": env.get("ACCELERATE_USE_FSDP", "").lower() == "true",
        "fsdp_version": int(env.get("FSDP_VERSION", "1") or 1),
        "num_processes": int(env.get("WORLD_SIZE", "1") or 1),
    }
    if config_file:
        path = accelerate_config_path(config_file)
        data = load_yaml_text(path.read_text(), str(path)) or {}
        kind = str(data.get("distributed_type", "")).upper()
        settings["deepspeed"] |= kind == "DEEPSPEED"
        if kind == "FSDP":
            settings["fsdp"] = True
            settings["fsdp_version"] = int((data.get("fsdp_config") or {}).get("fsdp_version", 1))
        settings["num_processes"] = max(settings["num_processes"], int(data.get("num_processes", 1) or 1))
    return settings


def _model_problems(config, trainer: dict) -> list[str]:
    """Read only the model's config.json: quantization and layer types."""
    problems = []
    init_kwargs = trainer.get("model_init_kwargs") or {}
    model_config = read_model_config(getattr(config, "model", None))
    if any(key in init_kwargs for key in QUANTIZATION_KEYS) or "quantization_config" in model_config:
        method = (model_config.get("quantization_config") or {}).get("quant_method", "quantized")
        problems.append(
            f"(trl) the model is {method} (quantization_config): AsyncGRPOTrainer has no quantization support and "
            "merged-weight sync cannot stream quantized tensors to vLLM. Use a bf16/fp32 checkpoint"
        )
    layer_types = set(model_config.get("layer_types") or []) - {"full_attention", "sliding_attention"}
    if layer_types:
        problems.append(
            f"(trl) the model has {sorted(layer_types)} layers: tree packing routes only attention layers along each "
            "sample's path. Use grpo_execution: sync for this architecture"
        )
    return problems


def _lora_problems(config) -> list[str]:
    lora = getattr(config, "lora", None)
    if lora is None or not lora.enabled:
        return []
    targets = [lora.target_modules] if isinstance(lora.target_modules, str) else list(lora.target_modules)
    bad = [t for t in targets if t.split(".")[-1] in HEAD_AND_EMBEDDINGS]
    if bad:
        return [
            (f"(trl) lora.target_modules {bad}: the async trainer's fused log-prob head reads the base weight and vLLM "
            "drops head/embedding LoRA deltas from logprobs, so trainer and server would disagree on every token. "
            "Keep LoRA on the attention/MLP projections")
        ]
    return []


def check_picklable(rewards: list, tools: list | None = None, environment_factory=None) -> None:
    """(trl) The rollout worker is a spawned process: rewards, tools and environments must pickle."""
    bad = []
    for item in [*rewards, *(tools or []), *([environment_factory] if environment_factory else [])]:
        try:
            pickle.dumps(item)
        except Exception as err:  # noqa: BLE001 - any pickling failure is the same problem
            bad.append(f"{getattr(item, '__name__', type(item).__name__)} ({type(err).__name__}: {err})")
    if bad:
        raise RufusError(
            "grpo_execution: async sends rewards, tools and environments to a spawned rollout process, so they must "
            f"pickle; these do not: {'; '.join(bad)}. Use module-level functions or class instances, not lambdas or "
            "closures"
        )
