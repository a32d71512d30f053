"""`rufus-train serve`: the vLLM server GRPO trains against (async, or sync in server mode), with
the settings TRL's `trl vllm-serve` imposes (trl/scripts/vllm_serve.py): the weight-transfer and
pause/resume routes over NCCL, logprobs after temperature (`processed_logprobs`, as the
importance ratio needs) without a count limit, bf16, and tensor parallelism over the given GPUs.
With `lora_rank`, adapters are served and synced alone, in max_staleness + 2 slots (TRL's
select_adapter_sync). The command itself is built by rufus_data/generate/vllm_command.py.

Its options are `ServeConfig`: the launch settings of every vLLM server Rufus starts
(`ServerLaunch`, the same flags as `rufus-data filter --backend vllm`) with the recipe's
defaults - the server on GPU 1 (the trainer keeps GPU 0) with a 16384-token context - plus what a
weight-synced server adds. `--stage NAME` takes the model, the GPUs (`devices.server`), the
port (`vllm_server`), the LoRA rank and `max_staleness` from that GRPO stage's config; options
given on the command line win.

Exposure: the server listens on 127.0.0.1 unless `--host` names another address; then it needs
the API key Rufus's clients send (OPENAI_API_KEY), handed to vLLM as VLLM_API_KEY (its
`--api-key`) in the server's environment only, so the key is in no command line, `ps` listing or
printed output, and a warning says what the key does not cover: vLLM checks it on /v1 routes
only, and the developer routes (VLLM_SERVER_DEV_MODE: pause/resume, weight transfer) stay open
to whoever reaches the port. Those routes are on because GRPO syncs its weights through them,
and the start says so."""

from __future__ import annotations

import ipaddress
import os
import shlex
import sys
from pathlib import Path
from typing import Annotated, Literal
from urllib.parse import urlparse

from pydantic import Field

from rufus_data.base.cli_options import Flag
from rufus_data.base.console import console
from rufus_data.base.errors import RufusError
from rufus_data.base.yaml_config import model_from_options
from rufus_data.generate.backend_config import ServerLaunch
from rufus_data.generate.vllm_command import VLLMServerArgs, format_command, module_command, server_command
from rufus_data.models.devices import gpu_ids
from rufus_data.models.openai_api import SERVER_KEY_VARIABLE, api_key
from rufus_data.models.reference import ModelRef

DEFAULT_SERVER_DEVICES = "1"  # the recipe: trainer on GPU 0, server on GPU 1
DEFAULT_PORT = 8000
DEFAULT_MAX_STALENESS = 4
DEFAULT_MAX_MODEL_LEN = 16384
DEFAULT_HOST = "127.0.0.1"
VLLM_KEY_VARIABLE = "VLLM_API_KEY"  # vLLM reads it as it reads --api-key


class ServeConfig(ServerLaunch):
    """The options of `rufus-train serve` (each field's description is its help). The launch
    settings are ServerLaunch's, declared again here only for the recipe's defaults; those a
    --stage may set default to None, resolved in server_args."""

    model: Annotated[str | None, Flag(argument=True, metavar="MODEL")] = Field(
        None, description="model to serve: built-in name, model folder or hub id (default: the --stage's model)")
    stage: str | None = Field(
        None, description="a GRPO stage whose config sets the model, devices.server, the port of vllm_server, the "
        "LoRA rank and max_staleness (options given here win)")
    config: Path | None = Field(None, description="with --stage: its YAML (default catalogs/stages/NAME.yaml)")
    host: str = Field(
        DEFAULT_HOST, description=f"the address the server listens on; another than loopback (e.g. 0.0.0.0) needs "
        f"the API key in ${SERVER_KEY_VARIABLE}, and leaves vLLM's weight-sync routes open to the network")
    port: int | None = Field(
        None, ge=1, le=65535, description=f"the server's port (default: the --stage's vllm_server port, else {DEFAULT_PORT})")
    lora_rank: int | None = Field(
        None, ge=1, description="serve LoRA adapters up to this rank: adapter-only weight sync (default: the --stage's "
        "lora.r)")
    max_staleness: int | None = Field(
        None, ge=0, description=f"with --lora_rank: adapter slots = this + 2 (default: the --stage's, else "
        f"{DEFAULT_MAX_STALENESS})")
    vllm_command: Annotated[list[str] | None, Flag(type=str, parse=shlex.split, metavar="COMMAND")] = Field(
        None, description="the server command, one quoted string (default: this interpreter's `python -m "
        "vllm.entrypoints.openai.api_server`, the vLLM the trainer imports)")
    devices: str | None = Field(
        None, description="the server's physical GPU ids (CUDA_VISIBLE_DEVICES); never the trainer's (default: the "
        f"--stage's devices.server, else {DEFAULT_SERVER_DEVICES})")
    max_model_len: int = Field(DEFAULT_MAX_MODEL_LEN, ge=1, description="prompt + completion tokens per request")
    data_parallel_size: int | None = Field(
        None, ge=1, description="replicas, each over an equal share of --devices with tensor parallelism (default: one "
        "server over all of them)")
    gpu_memory_utilization: float = Field(0.9, gt=0, le=1, description="the share of each GPU's memory the server may take")
    dtype: Literal["auto", "bfloat16", "float16", "float32"] = Field("bfloat16", description="the weights' dtype")

    def server_args(self, dry_run: bool = False) -> VLLMServerArgs:
        """The server's settings, the recipe's defaults filled in. With `dry_run` a built-in model
        not yet converted is named by the folder it will be converted into (converting loads it)."""
        devices = gpu_ids(DEFAULT_SERVER_DEVICES if self.devices is None else self.devices)
        if not devices:
            raise RufusError("--devices must name at least one GPU for the server (e.g. --devices 1)")
        replicas = self.data_parallel_size or 1
        if len(devices) % replicas:
            raise RufusError(f"--data_parallel_size {replicas} does not divide the {len(devices)} GPUs of --devices "
                             f"{self.devices}: give a multiple of it, or fewer replicas")
        if self.model is None:
            raise RufusError("give the MODEL to serve, or --stage NAME (a GRPO stage: its model and devices.server)")
        model = ModelRef.of(self.model)
        path = model.path if dry_run else model.folder()
        max_staleness = DEFAULT_MAX_STALENESS if self.max_staleness is None else self.max_staleness
        return VLLMServerArgs(
            model=path,
            # the name TRL's async rollout worker asks for: the trainer's config._name_or_path, i.e. the
            # resolved folder (sync server mode reads the name from /v1/models)
            served_model_name=path,
            command=self.vllm_command or module_command(sys.executable),
            host=self.host,
            port=self.port or DEFAULT_PORT,
            devices=",".join(devices),
            tensor_parallel_size=len(devices) // replicas,
            data_parallel_size=replicas if replicas > 1 else None,
            dtype=self.dtype,
            max_model_len=self.max_model_len,
            gpu_memory_utilization=self.gpu_memory_utilization,
            cpu=False,
            weight_transfer="nccl",
            logprobs_mode="processed_logprobs",
            max_logprobs=-1,
            lora_rank=self.lora_rank,
            max_loras=max_staleness + 2 if self.lora_rank else None,
        )


def serve_config(options: dict) -> ServeConfig:
    """The command line's options (those given), on top of the --stage's settings when one is named."""
    given = model_from_options(ServeConfig, options)
    if given.stage is None:
        if given.model is None:
            raise RufusError("give the MODEL to serve, or --stage NAME (a GRPO stage: its model and devices.server)")
        return given
    from rufus_train.config_loading import load_stage_config  # heavy: the stage registry imports TRL
    from rufus_train.stages import get_stage

    stage = load_stage_config(given.stage, get_stage(given.stage).config_class, given.config)
    return config_for_stage(stage, options)


def config_for_stage(config, options: dict | None = None) -> ServeConfig:
    """The server a GRPO stage config trains against: its model, `devices.server`, the port of
    its `vllm_server`, its LoRA rank and `max_staleness`; `options` (the command line's options
    that were set) win. The GPU roles are checked as the stage checks them."""
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
    values.update({k: v for k, v in (options or {}).items() if v is not None})
    serve = model_from_options(ServeConfig, values)
    # the trainer's GPUs are its role alone here: this process's own say nothing about them
    config.devices.model_copy(update={"server": serve.devices}).check(this_process_trains=False)
    return serve


def is_loopback(host: str) -> bool:
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name: it may resolve to any interface
        return False


def server_key(config: ServeConfig) -> str | None:
    """The API key a server listening beyond loopback must have; None on loopback. Refused,
    before anything starts, when the environment holds none."""
    if is_loopback(config.host):
        return None
    key = api_key(SERVER_KEY_VARIABLE)
    if not key:
        raise RufusError(
            f"--host {config.host} serves beyond this machine, and the server's weight-sync routes change its model: "
            f"set an API key in ${SERVER_KEY_VARIABLE} (Rufus's clients send it; the server gets it as "
            f"{VLLM_KEY_VARIABLE}), or leave --host at {DEFAULT_HOST} and reach the server through an SSH tunnel"
        )
    return key


def exposure_notes(config: ServeConfig) -> list[str]:
    """What the server exposes, said at its start: the developer routes, and beyond loopback what the key leaves open."""
    port = config.port or DEFAULT_PORT
    notes = [("vLLM's developer routes are on (VLLM_SERVER_DEV_MODE=1: pause/resume, weight transfer): GRPO syncs "
              f"the trained weights through them; listening on {config.host}:{port}")]
    if not is_loopback(config.host):
        notes.append(
            f"warning: the server listens on {config.host}:{port}, beyond this machine, with the API key from "
            f"${SERVER_KEY_VARIABLE}; vLLM checks the key on /v1 routes only, so the developer routes (pause, weight "
            "updates) answer anyone who reaches the port: keep it on a private network or behind a firewall")
    return notes


def serve_command(config: ServeConfig, dry_run: bool = False) -> tuple[dict[str, str], list[str]]:
    """(environment additions, argv) of the server; the API key is not among them (exec_server adds it)."""
    server_key(config)
    return server_command(config.server_args(dry_run))


def exec_server(config: ServeConfig) -> None:  # pragma: no cover - replaces the process
    env, argv = serve_command(config)
    key = server_key(config)
    console.print(f"[bold]starting the vLLM server:[/] {format_command(env, argv)}"
                  + (f" (with {VLLM_KEY_VARIABLE} from ${SERVER_KEY_VARIABLE}, not shown)" if key else ""))
    for note in exposure_notes(config):
        console.print(note, style="yellow" if note.startswith("warning") else None, highlight=False, soft_wrap=True)
    os.execvpe(argv[0], argv, {**os.environ, **env, **({VLLM_KEY_VARIABLE: key} if key else {})})
