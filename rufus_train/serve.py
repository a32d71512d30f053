"""`rufus-train serve`: the vLLM server GRPO trains against (async, or sync in server mode), with
the settings TRL's `trl vllm-serve` imposes (trl/scripts/vllm_serve.py): the weight-transfer and
pause/resume routes over NCCL, logprobs after temperature (`processed_logprobs`, as the
importance ratio needs) without a count limit, bf16, and tensor parallelism over the given GPUs.
With `lora_rank`, adapters are served and synced alone, in max_staleness + 2 slots (TRL's
select_adapter_sync). The command itself is built by rufus_data/generate/vllm_command.py.

Defaults follow the recipe: the server on GPU 1 (the trainer keeps GPU 0) with a 16384-token
context; `--stage NAME` takes the model, the GPUs (`devices.server`), the port (`vllm_server`),
the LoRA rank and `max_staleness` from that GRPO stage's config instead."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from urllib.parse import urlparse

from rufus_data.console import console
from rufus_data.devices import gpu_ids
from rufus_data.errors import RufusError
from rufus_data.generate.vllm_command import VLLMServerArgs, format_command, module_command, server_command
from rufus_data.models import resolve_model

DEFAULT_SERVER_DEVICES = "1"  # the recipe: trainer on GPU 0, server on GPU 1
DEFAULT_MAX_MODEL_LEN = 16384


@dataclass
class ServeSpec:
    """The options of `rufus-train serve`."""

    model: str
    devices: str = DEFAULT_SERVER_DEVICES  # the server's CUDA_VISIBLE_DEVICES (physical ids): never the trainer's
    host: str = "0.0.0.0"
    port: int = 8000
    max_model_len: int = DEFAULT_MAX_MODEL_LEN
    dtype: str = "bfloat16"
    gpu_memory_utilization: float = 0.9
    lora_rank: int | None = None  # serve LoRA adapters (adapter-only weight sync)
    max_staleness: int = 4
    python: str | None = None  # interpreter with vllm; default: this one

    def server_args(self) -> VLLMServerArgs:
        devices = gpu_ids(self.devices)
        if not devices:
            raise RufusError("--devices must name at least one GPU for the server (e.g. --devices 1)")
        path = resolve_model(self.model)
        return VLLMServerArgs(
            model=path,
            # the name TRL's async rollout worker asks for: the trainer's config._name_or_path, i.e. the
            # resolved folder (sync server mode reads the name from /v1/models)
            served_model_name=path,
            command=module_command(self.python or sys.executable),
            host=self.host,
            port=self.port,
            devices=",".join(devices),
            tensor_parallel_size=len(devices),
            dtype=self.dtype,
            max_model_len=self.max_model_len,
            gpu_memory_utilization=self.gpu_memory_utilization,
            cpu=False,
            weight_transfer="nccl",
            logprobs_mode="processed_logprobs",
            max_logprobs=-1,
            lora_rank=self.lora_rank,
            max_loras=self.max_staleness + 2 if self.lora_rank else None,
        )


def spec_for_stage(config, **given) -> ServeSpec:
    """The server a GRPO stage config trains against: its model, `devices.server` (default GPU 1),
    the port of its `vllm_server`, its LoRA rank and `max_staleness`; `given` (the command line's
    options that were set) wins. The GPU roles are checked as the stage checks them."""
    if not hasattr(config, "devices") or not hasattr(config, "server_url"):
        raise RufusError(f"stage {config.stage} is not a GRPO stage: `rufus-train serve --stage` takes reasoning_rl, "
                         "coding_rl, if_rl, rlhf or an agent stage")
    url = config.server_url
    values = {
        "model": config.model,
        "devices": config.devices.server or DEFAULT_SERVER_DEVICES,
        "lora_rank": config.lora.r if config.lora.enabled else None,
        "max_staleness": config.max_staleness,
        **({"port": urlparse(url).port} if url and urlparse(url).port else {}),
    }
    values.update({k: v for k, v in given.items() if v is not None})
    spec = ServeSpec(**values)
    # the trainer's GPUs are its role alone here: this process's own say nothing about them
    config.devices.model_copy(update={"server": spec.devices}).check(this_process_trains=False)
    return spec


def serve_command(spec: ServeSpec) -> tuple[dict[str, str], list[str]]:
    """(environment additions, argv) of the server."""
    return server_command(spec.server_args())


def exec_server(spec: ServeSpec) -> None:  # pragma: no cover - replaces the process
    env, argv = serve_command(spec)
    console.print(f"[bold]starting the vLLM server:[/] {format_command(env, argv)}")
    os.execve(argv[0], argv, {**os.environ, **env})
