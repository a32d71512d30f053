"""Where the answers come from: `hf` (in-process transformers), `vllm` (a server Rufus starts with
the generation launcher), `server` (an OpenAI-compatible endpoint the user runs); configured by
rufus_data's ModelAccess, the settings filter and pairs take too (from the evaluation request,
rufus_eval/request.py, where `auto` is decided), mapped here onto lm-eval's model classes.

Both lm-eval model classes below give each of a document's k samples its own seed. lm-eval
clones a request k times and the OpenAI backend sends one fixed `seed` with every request, so
against vLLM the k samples would be k copies of one answer. `rufus-completions` sends sample i of
every document of a task the seed `sample_seed(run_seed, task, i)` (the generation package's
rule): the k samples of a document differ, and the requests of one sample index share their
generation kwargs, which is what lm-eval groups concurrent requests by (one seed per document
and sample would make every group a single request, sent one after another).
`rufus-hf` seeds torch before the i-th sample of every document.

Both also stop where the model's family stops (rufus_data/models/end_tokens.py): its end tokens'
text joins every request's `until` (a task's own stop strings kept), and against vLLM their ids
go as `stop_token_ids`; and both render the chat template with a suite's `thinking:` keywords
(rufus_data/models/thinking.py; lm-eval's `chat_template_args`)."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator

import torch  # lm-eval's hf model has loaded it already
from lm_eval.api.registry import register_model
from lm_eval.models.huggingface import HFLM
from lm_eval.models.openai_completions import LocalCompletionsAPI

from rufus_data.base.errors import RufusError
from rufus_data.base.quiet_bars import bars_off
from rufus_data.generate import ModelAccess
from rufus_data.generate.context import server_max_model_len
from rufus_data.generate.launcher import launch
from rufus_data.generate.sampling import sample_seed
from rufus_data.models import devices
from rufus_data.models.end_tokens import EndTokens, folder_end_tokens
from rufus_data.models.openai_api import SERVER_KEY_VARIABLE, api_key, server_version, v1_url
from rufus_data.models.reference import ModelRef
from rufus_data.models.thinking import Thinking, model_thinking


def repeat_indices(requests) -> list[int]:
    """Which repeat each request is: lm-eval passes the same Instance object k times."""
    seen: dict[int, int] = {}
    out = []
    for req in requests:
        out.append(seen.get(id(req), 0))
        seen[id(req)] = out[-1] + 1
    return out


def with_end_strings(gen_kwargs: dict, end_strings: list[str]) -> dict:
    """A request's generation kwargs with the model's end strings added to its own `until`."""
    until = gen_kwargs.get("until") or []
    until = [until] if isinstance(until, str) else list(until)
    return {**gen_kwargs, "until": until + [s for s in end_strings if s not in until]}


@register_model("rufus-completions")
class SeededCompletionsAPI(LocalCompletionsAPI):
    """lm-eval's `local-completions` with a distinct, reproducible seed per sample, the model's
    end tokens and the suite's chat-template keywords."""

    def __init__(self, *args, end_strings: list[str] | None = None, stop_token_ids: list[int] | None = None,
                 chat_template_args: dict | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.end_strings = list(end_strings or [])
        self.stop_token_ids = list(stop_token_ids or [])
        self.chat_template_args = dict(chat_template_args or {})

    def apply_chat_template(self, chat_history, add_generation_prompt: bool = True):
        if self.tokenizer_backend == "huggingface" and self.tokenized_requests:
            return self.tokenizer.apply_chat_template(chat_history, tokenize=False,
                                                      add_generation_prompt=add_generation_prompt,
                                                      continue_final_message=not add_generation_prompt,
                                                      **self.chat_template_args)
        return super().apply_chat_template(chat_history, add_generation_prompt)

    def generate_until(self, requests, disable_tqdm: bool = False):
        seeded = []
        for req, index in zip(requests, repeat_indices(requests)):
            context, gen_kwargs = req.args[0], with_end_strings(dict(req.args[1]), self.end_strings)
            gen_kwargs["seed"] = sample_seed(self._seed, str(req.task_name), index)
            if self.stop_token_ids:
                gen_kwargs["stop_token_ids"] = self.stop_token_ids  # vLLM extension: the payload carries it
            seeded.append(dataclasses.replace(req, arguments=(context, gen_kwargs), resps=[], filtered_resps={}))
        return super().generate_until(seeded, disable_tqdm=disable_tqdm)


@register_model("rufus-hf")
class SeededHFLM(HFLM):
    """lm-eval's `hf` model; the i-th samples of all documents run together after seeding torch,
    stopping at the model's end tokens (their text joins `until`, their ids generate's eos)."""

    def __init__(self, *args, seed: int = 0, end_strings: list[str] | None = None,
                 end_token_ids: list[int] | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.rufus_seed = int(seed)
        self.end_strings = list(end_strings or [])
        self.end_token_ids = list(end_token_ids or [])

    def loglikelihood(self, requests, disable_tqdm: bool = False):
        return super().loglikelihood(requests, disable_tqdm=disable_tqdm or bars_off())

    def generate_until(self, requests, disable_tqdm: bool = False):
        ended = []
        for req in requests:
            gen_kwargs = with_end_strings(dict(req.args[1]), self.end_strings)
            if self.end_token_ids:
                gen_kwargs["eos_token_id"] = self.end_token_ids
            ended.append(dataclasses.replace(req, arguments=(req.args[0], gen_kwargs), resps=[], filtered_resps={}))
        disable_tqdm = disable_tqdm or bars_off()  # HFLM passes tqdm's `disable` itself (quiet_bars.py)
        return self._seeded_generate(ended, repeat_indices(requests), disable_tqdm)

    def _seeded_generate(self, requests, indices: list[int], disable_tqdm: bool) -> list[str]:
        results: list[str | None] = [None] * len(requests)
        for index in sorted(set(indices)):
            positions = [p for p, i in enumerate(indices) if i == index]
            torch.manual_seed(self.rufus_seed * 1000 + index)
            answers = HFLM.generate_until(self, [requests[p] for p in positions], disable_tqdm=disable_tqdm)
            for p, answer in zip(positions, answers):
                results[p] = answer
        return results


def model_chat(model: str, cfg: ModelAccess, thinking: str) -> tuple[Thinking, EndTokens | None]:
    """A suite's `thinking:` mode for the model's chat template, and the model's end tokens, read
    from its local files before anything loads (None: a server whose tokenizer is not here answers
    by its own generation config)."""
    local = (cfg.tokenizer or model) if cfg.backend == "server" else model
    mode = model_thinking(local, thinking)
    try:
        return mode, folder_end_tokens(ModelRef.of(local).folder())
    except Exception:  # only a served name may lack local files; a folder's error is its own
        if cfg.backend != "server":
            raise
        return mode, None


@contextlib.contextmanager
def open_backend(model: str, cfg: ModelAccess, seed: int = 0, batch_size: int = 16, thinking: Thinking = Thinking(),
                 ends: EndTokens | None = None) -> Iterator[tuple[str, dict, dict]]:
    """Yield (lm-eval model name, model args, facts for the results) for `model` - a model folder
    (hf, vllm) or the name a server knows it by - and clean up afterwards; `batch_size`: the hf
    backend's (lm-eval's); `thinking`, `ends`: model_chat's."""
    chat = {key: value for key, value in (("chat_template_args", thinking.template_kwargs()),
                                          ("end_strings", list(ends.strings) if ends else [])) if value}
    end_ids = list(ends.ids) if ends else []
    if cfg.backend == "hf":
        cuda = devices.gpu_count() > 0
        args = {"pretrained": model, "device": "cuda" if cuda else "cpu",
                "dtype": cfg.dtype or ("auto" if cuda else "float32"), "batch_size": batch_size, "seed": seed,
                **chat, **({"end_token_ids": end_ids} if end_ids else {})}
        if cfg.max_model_len:
            args["max_length"] = cfg.max_model_len
        yield "rufus-hf", args, {"backend": "hf"}
    elif cfg.backend == "vllm":
        with launch(cfg.launch_config(model, cfg.served_model_name or model)) as server:
            args = {**_api_args(cfg, server.base_url, server.model, model, seed), **chat,
                    **({"stop_token_ids": end_ids} if end_ids else {})}
            yield "rufus-completions", args, {
                "backend": "vllm",
                "server_pgid": server.pgid,
                "server_version": server_version(server.base_url, key=api_key(SERVER_KEY_VARIABLE)),
            }
    elif cfg.backend == "server":
        if len(cfg.base_urls) != 1:
            raise RufusError(f"rufus-eval talks to one endpoint; give one --base-url, not {len(cfg.base_urls)}")
        base_url = cfg.base_urls[0]
        # a built-in name or a folder as --tokenizer: what from_pretrained loads (lm-eval takes it as a hub id)
        tokenizer = ModelRef.of(cfg.tokenizer).folder() if cfg.tokenizer else model
        yield "rufus-completions", {**_api_args(cfg, base_url, cfg.served_model_name or model, tokenizer, seed), **chat}, {
            "backend": "server",
            "server_version": server_version(base_url, key=api_key(SERVER_KEY_VARIABLE)),
        }
    else:
        raise ValueError(f"resolve the request first: backend {cfg.backend!r}")


def _api_args(cfg: ModelAccess, base_url: str, model: str, tokenizer: str, seed: int) -> dict:
    """lm-eval's arguments for the server: lm-eval sends the generation requests itself (aiohttp,
    its own retries, OPENAI_API_KEY); the questions before them go through rufus_data.models.openai_api."""
    max_len = server_max_model_len(base_url, model) or cfg.max_model_len or 2048
    return {
        "model": model,
        "base_url": f"{v1_url(base_url)}/completions",
        "tokenizer": tokenizer,
        "tokenizer_backend": "huggingface",
        "tokenized_requests": True,
        "max_length": max_len,
        "num_concurrent": cfg.concurrency,
        "max_retries": 3,
        "seed": seed,
        "timeout": 600,
    }
