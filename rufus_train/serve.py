"""`rufus-train serve`: the vLLM server GRPO trains against (async, or sync in server mode), with
the settings TRL's `trl vllm-serve` imposes (trl/scripts/vllm_serve.py): the weight-transfer and
pause/resume routes over NCCL, logprobs after temperature (`processed_logprobs`, as the
importance ratio needs) without a count limit, bf16, and tensor parallelism over the given GPUs.
With `lora_rank`, adapters are served and synced alone, in max_staleness + 2 slots (TRL's
select_adapter_sync). The command itself is built by rufus_data/generate/vllm_command.py."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass

from rufus_data.console import console
from rufus_data.errors import RufusError
from rufus_data.generate.vllm_command import VLLMServerArgs, format_command, module_command, server_command
from rufus_data.models import resolve_model


@dataclass
class ServeSpec:
    """The options of `rufus-train serve`."""

    model: str
    devices: str = "0"  # CUDA_VISIBLE_DEVICES of the server: never the trainer's GPUs
    host: str = "0.0.0.0"
    port: int = 8000
    max_model_len: int = 4096
    dtype: str = "bfloat16"
    gpu_memory_utilization: float = 0.9
    lora_rank: int | None = None  # serve LoRA adapters (adapter-only weight sync)
    max_staleness: int = 4
    python: str | None = None  # interpreter with vllm; default: this one

    def server_args(self) -> VLLMServerArgs:
        devices = [d.strip() for d in str(self.devices).split(",") if d.strip()]
        if not devices:
            raise RufusError("--devices must name at least one GPU for the server (e.g. --devices 1)")
        return VLLMServerArgs(
            model=resolve_model(self.model),
            served_model_name=self.model,
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


def serve_command(spec: ServeSpec) -> tuple[dict[str, str], list[str]]:
    """(environment additions, argv) of the server."""
    return server_command(spec.server_args())


def exec_server(spec: ServeSpec) -> None:  # pragma: no cover - replaces the process
    env, argv = serve_command(spec)
    console.print(f"[bold]starting the vLLM server:[/] {format_command(env, argv)}")
    os.execve(argv[0], argv, {**os.environ, **env})
