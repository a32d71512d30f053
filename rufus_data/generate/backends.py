"""Opening a generator: `check_model` refuses a model that cannot load before anything starts,
`open_generator` picks one of the three backends for resolved ModelAccess settings, and `check_prompts_fit`
runs the max_model_len check (context.py) before the first request."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

from rufus_data.base.console import console
from rufus_data.base.errors import RufusError
from rufus_data.generate.backend_config import ModelAccess
from rufus_data.generate.base import Generator, Prompt
from rufus_data.generate.context import check_context_fits
from rufus_data.generate.hf import HFGenerator
from rufus_data.generate.launcher import launch
from rufus_data.generate.sampling import SamplingParams
from rufus_data.generate.server import ServerConfig, ServerGenerator
from rufus_data.models.end_tokens import folder_end_tokens
from rufus_data.models.hub import model_unavailable
from rufus_data.models.merged_model import plain_folder
from rufus_data.models.reference import ModelRef, require_loadable
from rufus_data.models.thinking import Thinking, model_thinking


def model_to_load(model: str, config: ModelAccess) -> str | ModelRef:
    """The model a command generates with, resolved once where the command starts: a ModelRef for
    the hf and vllm backends, which load it here; a server's name for its model as given (a served
    name is not a reference: vLLM's default is the path it loaded, on another machine)."""
    return model if config.backend == "server" else ModelRef.of(model)


def check_model(model: str | ModelRef, config: ModelAccess) -> None:
    """Refuse, in one paragraph, a model the hf or vllm backend could not load from here (reference.py's
    require_loadable: a typo of a built-in, a hub id neither cached nor reachable). A server's model
    is the server's business."""
    if config.backend == "server":
        return
    try:
        require_loadable(model)
    except RufusError as err:
        raise RufusError(f"{err} (or --backend server --base-url URL)") from None


def generator_thinking(model: str | ModelRef, config: ModelAccess, mode: str) -> Thinking:
    """A `thinking:` mode for the model a generator serves (models/thinking.py), read from its
    local tokenizer (a server's: --tokenizer, else the served name as a reference) before any
    weights load or server starts."""
    return model_thinking(config.tokenizer or model if config.backend == "server" else model, mode)


@contextlib.contextmanager
def open_generator(model: str | ModelRef, config: ModelAccess, thinking: str = "default") -> Iterator[Generator]:
    """A ready generator for `model` (from `model_to_load`); anything it started (a vLLM server) is
    stopped on exit. `config` is resolved: `auto` was decided where the command started. `thinking`:
    the mode every prompt renders with (on, off, default). The vllm backend stops on the folder's
    end tokens; a server the user runs on its own generation config."""
    if config.backend == "auto":
        raise ValueError("resolve the model access first (ModelAccess.resolved)")
    mode = generator_thinking(model, config, thinking)
    if config.backend == "server":  # the server's name for its model: nothing here to resolve
        name = config.served_model_name or model
        cfg = ServerConfig(base_urls=config.base_urls, model=name, concurrency=config.concurrency, thinking=mode)
        with ServerGenerator(cfg) as gen:
            yield gen
        return
    if config.backend == "hf":
        with HFGenerator(model, dtype=config.dtype or "bfloat16", thinking=mode) as gen:
            yield gen
        return
    folder = plain_folder(model)  # vLLM serves a LoRA run merged
    ends = folder_end_tokens(folder)
    with launch(config.launch_config(folder, config.served_model_name or model.text)) as server:
        cfg = ServerConfig(base_urls=[server.base_url], model=server.model, concurrency=config.concurrency,
                           thinking=mode, stop_token_ids=ends.ids)
        with ServerGenerator(cfg) as gen:
            yield gen


def longest_prompt_tokens(model: str | ModelRef, prompts: Sequence[Prompt], thinking: Thinking = Thinking()) -> int | None:
    """Tokens of the longest chat-templated prompt (in `thinking`'s mode), with the model's
    tokenizer (None if unavailable: a served name without a local tokenizer)."""
    try:
        ref = ModelRef.of(model)
    except RufusError:  # a served name that is a path with nothing there: no tokenizer to count with
        return None
    if ref.kind == "hub" and model_unavailable(ref.text):  # not cached, no hub: skip at once, not after the
        return None                                           # hub client's retries (about 40 s offline)
    try:
        from transformers import AutoTokenizer  # heavy: loaded only when a server's context is checked

        tokenizer = AutoTokenizer.from_pretrained(ref.folder())  # a served name may be a local one
    except Exception:  # noqa: BLE001 - a served name without a local tokenizer: the check is skipped
        return None
    longest = 0
    for prompt in prompts:
        ids = tokenizer.apply_chat_template(thinking.messages(prompt.messages), add_generation_prompt=True,
                                            tokenize=True, **thinking.template_kwargs())
        longest = max(longest, len(ids["input_ids"] if hasattr(ids, "keys") else ids))
    return longest


def check_prompts_fit(generator: Generator, model: str | ModelRef, prompts: Sequence[Prompt], sampling: SamplingParams) -> str:
    """For server-backed generators: refuse prompts + max_tokens above any server's max_model_len
    (context.check_fits). Returns "ok", "n/a" (in-process hf), or "skipped: <why>" - no local
    tokenizer to count prompt tokens, or a server that did not answer - after printing that."""
    base_urls = getattr(generator, "base_urls", None)
    if not base_urls or not prompts:
        return "n/a"
    longest = longest_prompt_tokens(model, prompts, getattr(generator.config, "thinking", Thinking()))
    if longest is None:
        name = model.text if isinstance(model, ModelRef) else model
        status = f"skipped: no local tokenizer for {name!r} to count the prompt tokens"
    else:
        silent = [url for url in base_urls
                  if check_context_fits(url, longest, sampling.max_tokens, model=generator.model) != "ok"]
        if not silent:
            return "ok"
        status = f"skipped: the server did not answer GET /v1/models at {', '.join(silent)}"
    console.print(f"[yellow]max_model_len check {status}[/]")
    return status
