"""How to reach a model: the settings of the three generation backends, kept free of the
backends' own libraries so that the command-line options built from them load nothing heavy."""

from __future__ import annotations

from dataclasses import dataclass, field

from rufus_data.errors import RufusError
from rufus_data.generate.vllm_command import LaunchConfig

BACKENDS = ("hf", "vllm", "server")


@dataclass
class BackendConfig:
    """How to reach a model, for every command that generates: filter and pairs (open_generator)
    and rufus-eval (rufus_eval/backends.py). A field the chosen backend does not use is ignored;
    the commands set their own defaults where they build it (rufus-eval: 8 requests in flight)."""

    backend: str = "hf"
    base_urls: list[str] = field(default_factory=list)  # server: OpenAI-compatible endpoints
    # server: the name the endpoint knows the model by; vllm: the name Rufus serves it under
    # (default for both: the model reference)
    served_model_name: str | None = None
    tokenizer: str | None = None  # server, rufus-eval: a local tokenizer of the served model (default: the model)
    concurrency: int = 32  # server / vllm: requests in flight
    vllm_command: list[str] | None = None  # vllm: default vllm_command.default_command()
    devices: str | None = None  # vllm: CUDA_VISIBLE_DEVICES of the server, verbatim
    max_model_len: int | None = None  # vllm: --max-model-len of the server
    data_parallel_size: int = 1  # vllm: --data-parallel-size of the server
    vllm_args: list[str] = field(default_factory=list)  # vllm: more server arguments
    dtype: str | None = None  # hf and vllm: default bfloat16 (rufus-eval's hf: auto on GPU, float32 on CPU)
    batch_size: int = 16  # hf, rufus-eval: lm-eval's batch size

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise RufusError(f"unknown backend {self.backend!r}: use one of {', '.join(BACKENDS)}")
        if self.backend == "server" and not self.base_urls:
            raise RufusError("--backend server needs --base-url (one or more OpenAI-compatible endpoints)")

    def launch_config(self, model_path: str, model: str) -> LaunchConfig:
        """The vLLM server of the `vllm` backend: `model_path` (a folder) served as the
        served_model_name, else as the reference `model`."""
        return LaunchConfig(
            model=model_path,
            served_model_name=self.served_model_name or model,
            command=self.vllm_command,
            devices=self.devices,
            max_model_len=self.max_model_len,
            data_parallel_size=self.data_parallel_size if self.data_parallel_size > 1 else None,
            dtype=self.dtype,
            extra_args=list(self.vllm_args),
        )
