"""How a command reaches a model: one settings model for every command that generates or
serves, kept free of the backends' own libraries so that the command-line options built from it
load nothing heavy.

- `ServerLaunch`: how Rufus starts a vLLM server (its command, GPUs, context, replicas, memory,
  dtype): the `vllm` backend of filter, pairs and rufus-eval, and `rufus-train serve`.
- `ModelAccess`: the backend (`auto`, hf, vllm, server), the servers' URLs and the model's name
  there, on top of the launch settings: `rufus-data filter/pairs` (rollouts/options.py),
  `rufus-eval suite` and the checkpoint evaluation (rufus_eval/request.py) build on it.
- `choose_backend`: the one `auto` policy (vLLM when a GPU and vLLM are here, else transformers
  in-process), applied by `ModelAccess.resolved()` before anything loads, for every caller."""

from __future__ import annotations

import shlex
from typing import Annotated, Literal, Self

from pydantic import Field, model_validator

from rufus_data.base.cli_options import Flag
from rufus_data.base.console import console
from rufus_data.base.errors import RufusError
from rufus_data.base.yaml_config import StrictModel, model_from_options
from rufus_data.generate.vllm_command import LaunchConfig, default_command
from rufus_data.models import devices

Backend = Literal["auto", "hf", "vllm", "server"]
# the backends of an evaluation that loads or serves a model folder itself (a checkpoint): no `server`
FolderBackend = Literal["auto", "hf", "vllm"]


class ServerLaunch(StrictModel):
    """How Rufus starts a vLLM server. Each field is also a command-line option, its description
    the option's help."""

    vllm_command: Annotated[list[str] | None, Flag(type=str, parse=shlex.split, metavar="COMMAND")] = Field(
        None, description="vllm: the server command, one quoted string (default: $RUFUS_VLLM_COMMAND, else `vllm "
        "serve` if on PATH, else `.venv-vllm/bin/python -m vllm.entrypoints.openai.api_server`)")
    devices: str | None = Field(None, description="vllm: the server's GPUs, CUDA_VISIBLE_DEVICES verbatim (e.g. 1 or 2,3)")
    max_model_len: int | None = Field(None, ge=1, description="vllm: the server's --max-model-len (prompt + completion "
                                      "tokens; default: the model's)")
    data_parallel_size: int | None = Field(None, ge=1, description="vllm: the server's --data-parallel-size (replicas)")
    gpu_memory_utilization: float | None = Field(
        None, gt=0, le=1, description="vllm: the share of each GPU's memory the server may take (vLLM's default 0.9)")
    dtype: Literal["auto", "bfloat16", "float16", "float32"] | None = Field(
        None, description="weights' dtype of the hf backend and the vllm server (default: bfloat16 for generation; "
        "rufus-eval's hf: auto on a GPU, float32 on CPU)")

    def launch_config(self, model_path: str, served_name: str) -> LaunchConfig:
        """The vLLM server of the `vllm` backend: `model_path` (a folder) served as `served_name`."""
        return LaunchConfig(
            model=model_path,
            served_model_name=served_name,
            command=self.vllm_command,
            devices=self.devices,
            max_model_len=self.max_model_len,
            data_parallel_size=self.data_parallel_size if (self.data_parallel_size or 1) > 1 else None,
            gpu_memory_utilization=self.gpu_memory_utilization,
            dtype=self.dtype if self.dtype != "auto" else None,
        )


class ModelAccess(ServerLaunch):
    """How a command reaches a model: in-process (hf), a vLLM server Rufus starts (vllm), or
    OpenAI-compatible servers already running (server); `auto` decides by the machine."""

    backend: Backend = Field(
        "auto", description="auto (vllm when a GPU and vLLM are here, else hf) | hf (transformers in-process) | vllm "
        "(Rufus starts a vLLM server) | server (OpenAI-compatible endpoints already running: --base-url)")
    base_urls: Annotated[list[str], Flag("--base-url", metavar="URL")] = Field(
        default_factory=list, description="server: an OpenAI-compatible endpoint, repeatable (requests are spread over them)")
    served_model_name: str | None = Field(
        None, description="server: the model's name at the endpoint; vllm: the name Rufus serves it under (default: "
        "the model reference)")
    tokenizer: str | None = Field(None, description="server: a local tokenizer of the served model (default: the model)")
    concurrency: int = Field(32, ge=1, description="vllm and server: requests in flight")

    @model_validator(mode="after")
    def _server_needs_urls(self) -> Self:
        if self.backend == "server" and not self.endpoints():
            raise ValueError("--backend server needs --base-url (one or more OpenAI-compatible endpoints)")
        if self.endpoints() and self.backend not in ("server", "auto"):
            raise ValueError(f"--base-url is for --backend server, not {self.backend}: drop one of them")
        return self

    def endpoints(self) -> list[str]:
        """Every server URL the settings name (a command with more models names more)."""
        return list(self.base_urls)

    def backend_choice(self) -> tuple[str, str]:
        """(the backend these settings run on, why): `auto` decided, a server when URLs are given,
        else by choose_backend. A --dry-run plan shows both."""
        if self.backend != "auto":
            return self.backend, "as asked"
        if self.endpoints():
            return "server", "auto: --base-url given"
        return choose_backend()

    def resolved(self, say: bool = True) -> Self:
        """These settings with `auto` decided (said on the console with why, unless `say` is off)."""
        backend, why = self.backend_choice()
        if say:
            console.print(f"backend: {backend} ({why})", highlight=False, markup=False, soft_wrap=True)
        return self.model_copy(update={"backend": backend})

    def access(self, base_urls: list[str] | None = None) -> ModelAccess:
        """Just the access settings (a command's config holds more), with other `base_urls` where a
        model of the command has its own (pairs' --strong-base-url)."""
        fields = self.model_dump(include=set(ModelAccess.model_fields))
        return model_from_options(ModelAccess, {**fields, "base_urls": base_urls or self.base_urls})


def vllm_available() -> bool:
    """A vLLM server command Rufus can start ($RUFUS_VLLM_COMMAND, `vllm` on PATH, or the CPU build)."""
    try:
        default_command()
    except RufusError:
        return False
    return True


def choose_backend() -> tuple[str, str]:
    """(backend, why) of `auto`: vLLM when a GPU and vLLM are both here, else hf in-process."""
    gpus = devices.gpu_count()
    if gpus and vllm_available():
        return "vllm", f"auto: {gpus} GPU(s) and vLLM found"
    return "hf", "auto: " + ("vLLM is not installed" if gpus else "no GPU") + ", so transformers in-process"
