"""Generation behind one interface (`Generator.stream(prompts, sampling)`), three backends:

- `server`: any OpenAI-compatible endpoint(s) (server.py),
- `vllm`: a vLLM server Rufus starts and stops itself (launcher.py) + the server client,
- `hf`: transformers `generate` in-process (hf.py), the embedded default on CPU.

`open_generator` picks one; `check_prompts_fit` runs the max_model_len check (context.py)
before the first request."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from rufus_data.console import console
from rufus_data.errors import RufusError
from rufus_data.generate.base import Completion, Generator, Prompt, PromptResult
from rufus_data.generate.context import check_context_fits, check_fits
from rufus_data.generate.hf import HFGenerator
from rufus_data.generate.launcher import LaunchConfig, launch
from rufus_data.generate.sampling import SamplingParams, prompt_seed, sample_seed
from rufus_data.generate.server import ServerConfig, ServerGenerator
from rufus_data.models import resolve_model

BACKENDS = ("hf", "vllm", "server")

__all__ = [
    "BACKENDS",
    "BackendConfig",
    "Completion",
    "Generator",
    "Prompt",
    "PromptResult",
    "SamplingParams",
    "check_context_fits",
    "check_fits",
    "check_prompts_fit",
    "open_generator",
    "prompt_seed",
    "sample_seed",
]


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


@contextlib.contextmanager
def open_generator(model: str, config: BackendConfig) -> Iterator[Generator]:
    """A ready generator for `model`; anything it started (a vLLM server) is stopped on exit."""
    if config.backend == "hf":
        with HFGenerator(model, dtype=config.dtype or "bfloat16") as gen:
            yield gen
        return
    if config.backend == "server":
        name = config.served_model_name or model
        with ServerGenerator(ServerConfig(base_urls=config.base_urls, model=name, concurrency=config.concurrency)) as gen:
            yield gen
        return
    with launch(config.launch_config(resolve_model(model), model)) as server:
        cfg = ServerConfig(base_urls=[server.base_url], model=server.model, concurrency=config.concurrency)
        with ServerGenerator(cfg) as gen:
            yield gen


def longest_prompt_tokens(model: str, prompts: Sequence[Prompt]) -> int | None:
    """Tokens of the longest chat-templated prompt, with the model's tokenizer (None if unavailable)."""
    try:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(resolve_model(model))
    except Exception:  # noqa: BLE001 - a served name without a local tokenizer: the check is skipped
        return None
    longest = 0
    for prompt in prompts:
        ids = tokenizer.apply_chat_template(prompt.messages, add_generation_prompt=True, tokenize=True)
        longest = max(longest, len(ids["input_ids"] if hasattr(ids, "keys") else ids))
    return longest


def check_prompts_fit(generator: Generator, model: str, prompts: Sequence[Prompt], sampling: SamplingParams) -> str:
    """For server-backed generators: refuse prompts + max_tokens above any server's max_model_len
    (context.check_fits). Returns "ok", "n/a" (in-process hf), or "skipped: <why>" - no local
    tokenizer to count prompt tokens, or a server that did not answer - after printing that."""
    base_urls = getattr(generator, "base_urls", None)
    if not base_urls or not prompts:
        return "n/a"
    longest = longest_prompt_tokens(model, prompts)
    if longest is None:
        status = f"skipped: no local tokenizer for {model!r} to count the prompt tokens"
    else:
        silent = [url for url in base_urls
                  if check_context_fits(url, longest, sampling.max_tokens, model=generator.model) != "ok"]
        if not silent:
            return "ok"
        status = f"skipped: the server did not answer GET /v1/models at {', '.join(silent)}"
    console.print(f"[yellow]max_model_len check {status}[/]")
    return status
