"""The `server` backend: any OpenAI-compatible chat endpoint (vLLM first of all).

One request per prompt asks for all `n` samples with `seed = prompt seed` (vLLM seeds the
children `seed + i`, see sampling.py), so samples differ and runs reproduce. Requests run
asynchronously with bounded concurrency, are retried by the shared policy (rufus_data/models/openai_api.py:
connection problems, 408/429/5xx, jittered backoff or the server's Retry-After, a bound on total
time; any other 4xx stops the run with the server's message), and are spread over several base
URLs: every attempt goes to the URL with the fewest requests in flight, ties broken round-robin.
A URL that refuses connections `drop_after` times in a row is dropped for the rest of the run
(logged) while another URL still answers. The API key is OPENAI_API_KEY when set.

`return_token_ids` is a vLLM extension; a strict OpenAI-compatible endpoint answers 400 naming
it. Then the request is sent again without it, once, and the rest of the run leaves it out;
token counts then come from each choice's logprobs (one entry per generated token)."""

from __future__ import annotations

import asyncio
import itertools
import queue
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

import httpx

from rufus_data.base.console import console
from rufus_data.base.errors import RufusError
from rufus_data.generate.base import Completion, Generator, Prompt, PromptResult
from rufus_data.generate.sampling import SamplingParams
from rufus_data.models.openai_api import (
    SERVER_KEY_VARIABLE,
    RetryPolicy,
    ServerRefused,
    api_key,
    async_client,
    capped,
    checked,
    root_url,
)
from rufus_data.models.thinking import Thinking


@dataclass
class ServerConfig:
    base_urls: list[str]
    model: str
    concurrency: int = 32  # requests in flight over all URLs
    max_retries: int = 5
    backoff_s: float = 0.5  # first retry delay; doubles each attempt (with jitter)
    timeout_s: float = 600.0  # one attempt
    retry_total_s: float = 1800.0  # one request, all its attempts and waits together
    drop_after: int = 3  # consecutive connection failures after which a URL is dropped
    logprobs: bool = True
    api_key: str | None = None  # None: OPENAI_API_KEY, if set
    thinking: Thinking = field(default_factory=Thinking)  # the mode's system flag or `chat_template_kwargs` (models/thinking.py)
    stop_token_ids: tuple[int, ...] = ()  # the model's end tokens (models/end_tokens.py), when read here


class ServerGenerator(Generator):
    def __init__(self, config: ServerConfig):
        if not config.base_urls:
            raise RufusError("the server backend needs at least one --base-url (e.g. http://127.0.0.1:8000)")
        self.config = config
        self.model = config.model
        self.base_urls = [root_url(u) for u in config.base_urls]
        self.retry = RetryPolicy(attempts=config.max_retries + 1, backoff_s=config.backoff_s,
                                 total_s=config.retry_total_s)
        self.in_flight = dict.fromkeys(self.base_urls, 0)
        self.sent = dict.fromkeys(self.base_urls, 0)  # requests per URL, for reports and tests
        self.live = list(self.base_urls)  # URLs still in use (see drop_after)
        self.retries = 0  # attempts beyond each request's first, over the run
        self.send_token_ids = True  # False once a server refused the return_token_ids field
        self._connect_failures = dict.fromkeys(self.base_urls, 0)
        self._turn = itertools.count()

    # --- request building -------------------------------------------------------------------
    def request_body(self, prompt: Prompt, sampling: SamplingParams) -> dict:
        body = {
            "model": self.model,
            "messages": self.config.thinking.messages(prompt.messages),
            "n": sampling.n,
            "max_tokens": sampling.max_tokens,
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
        }
        if self.send_token_ids:
            body["return_token_ids"] = True  # vLLM extension (see the module docstring)
        if sampling.seed is not None:
            body["seed"] = sampling.prompt_seed(prompt.id)
        # vLLM's extra sampling fields, sent only when they differ from "off"
        if sampling.top_k:
            body["top_k"] = sampling.top_k
        if sampling.min_p:
            body["min_p"] = sampling.min_p
        if sampling.repetition_penalty != 1.0:
            body["repetition_penalty"] = sampling.repetition_penalty
        if self.config.logprobs:
            body["logprobs"] = True
        if self.config.thinking.template_kwargs():
            body["chat_template_kwargs"] = self.config.thinking.template_kwargs()  # vLLM extension
        if self.config.stop_token_ids:
            body["stop_token_ids"] = list(self.config.stop_token_ids)  # vLLM extension
        return body

    @staticmethod
    def parse_choices(data: dict, base_seed: int | None) -> list[Completion]:
        completions = []
        # without token ids, each choice's count is its logprob entries (one per generated token);
        # the response's usage total can stand in only for a single choice
        usage = (data.get("usage") or {}).get("completion_tokens")
        single = len(data.get("choices", [])) == 1
        for choice in sorted(data.get("choices", []), key=lambda c: c.get("index", 0)):
            content = (choice.get("message") or {}).get("content") or ""
            logprobs = None
            if choice.get("logprobs") and choice["logprobs"].get("content") is not None:
                logprobs = [t["logprob"] for t in choice["logprobs"]["content"]]
            token_ids = choice.get("token_ids") or []
            completions.append(
                Completion(
                    text=content,
                    token_ids=list(token_ids),
                    finish_reason=choice.get("finish_reason") or "stop",
                    seed=None if base_seed is None else base_seed + choice.get("index", 0),
                    logprobs=logprobs,
                    token_count=None if token_ids else (len(logprobs) if logprobs is not None else (usage if single else None)),
                )
            )
        return completions

    # --- load spreading ---------------------------------------------------------------------
    def _pick_url(self) -> str:
        least = min(self.in_flight[u] for u in self.live)
        candidates = [u for u in self.live if self.in_flight[u] == least]
        return candidates[next(self._turn) % len(candidates)]

    def _connection_failed(self, url: str) -> None:
        self._connect_failures[url] += 1
        if self._connect_failures[url] >= self.config.drop_after and url in self.live and len(self.live) > 1:
            self.live.remove(url)
            console.print(
                f"[yellow]dropping {url}: {self._connect_failures[url]} connection failures in a row; "
                f"going on with {', '.join(self.live)}[/]"
            )

    @staticmethod
    def _refuses_token_ids(response: httpx.Response, body: dict) -> bool:
        return response.status_code == 400 and "return_token_ids" in body and "return_token_ids" in response.text

    # --- one request, with retries ----------------------------------------------------------
    async def _complete(self, client: httpx.AsyncClient, prompt: Prompt, sampling: SamplingParams) -> PromptResult:
        body = self.request_body(prompt, sampling)
        attempts = 0

        async def attempt(left_s: float) -> PromptResult:
            nonlocal attempts
            attempts += 1
            if attempts > 1:
                self.retries += 1
            url = self._pick_url()
            self.in_flight[url] += 1
            try:
                response = await self._post_once(client, url, body, left_s, prompt, sampling)
                if self._refuses_token_ids(response, body):
                    if self.send_token_ids:
                        self.send_token_ids = False
                        console.print(f"[yellow]{url} does not take return_token_ids: leaving it out for this run; "
                                      "token counts come from the logprobs[/]")
                    del body["return_token_ids"]
                    self.retries += 1
                    response = await self._post(client, url, body, left_s)  # at once, not counted as an attempt
            finally:
                self.in_flight[url] -= 1
            completions = self.parse_choices(checked(response, self.model).json(), body.get("seed"))
            if len(completions) != sampling.n:
                raise RufusError(
                    f"{url} returned {len(completions)} completions for prompt {prompt.id}, asked for n={sampling.n}"
                )
            return PromptResult(prompt, completions)

        try:
            return await self.retry.acall(attempt, what=f"prompt {prompt.id}: the server")
        except ServerRefused as err:
            raise RufusError(f"prompt {prompt.id}: {err}") from None

    async def _post_once(self, client: httpx.AsyncClient, url: str, body: dict, left_s: float, prompt: Prompt,
                         sampling: SamplingParams) -> httpx.Response:
        """`_post`, except that a request the server took too long to answer is not sent again: the
        server is most likely still generating it, and a second copy only adds to what made it slow."""
        try:
            return await self._post(client, url, body, left_s)
        except httpx.ReadTimeout:
            raise RufusError(
                f"prompt {prompt.id}: {url} gave no answer within {self.config.timeout_s:g} s (n={sampling.n}, "
                f"max_tokens={sampling.max_tokens}, {self.in_flight[url]} requests in flight there). It was not sent "
                "again, since the server is likely still generating it: lower --concurrency, or raise the request "
                "timeout; finished prompts are kept and the same command resumes") from None

    async def _post(self, client: httpx.AsyncClient, url: str, body: dict, left_s: float) -> httpx.Response:
        """One POST to `url`, counted; a refused connection counts towards dropping the URL."""
        self.sent[url] += 1
        try:
            response = await client.post(f"{url}/v1/chat/completions", json=body, timeout=capped(client.timeout, left_s))
        except httpx.ConnectError:
            self._connection_failed(url)
            raise
        self._connect_failures[url] = 0
        return response

    async def astream(self, prompts: Iterable[Prompt], sampling: SamplingParams):
        """Async iterator of results as they complete; at most `concurrency` requests in flight."""
        prompts = iter(prompts)
        key = self.config.api_key or api_key(SERVER_KEY_VARIABLE)
        http = async_client(self.base_urls, key=key, timeout_s=self.config.timeout_s, connections=self.config.concurrency)
        async with http as client:
            pending: set[asyncio.Task] = set()

            def refill() -> None:
                while len(pending) < self.config.concurrency:
                    prompt = next(prompts, None)
                    if prompt is None:
                        return
                    pending.add(asyncio.create_task(self._complete(client, prompt, sampling)))

            refill()
            try:
                while pending:
                    done, _ = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                    for task in done:
                        pending.discard(task)
                        yield task.result()
                    refill()
            finally:
                for task in pending:
                    task.cancel()
                await asyncio.gather(*pending, return_exceptions=True)

    def stream(self, prompts: Iterable[Prompt], sampling: SamplingParams) -> Iterator[PromptResult]:
        """Synchronous view of `astream`: an event loop in a helper thread feeds a queue."""
        results: queue.Queue = queue.Queue(maxsize=4 * self.config.concurrency)
        stop = threading.Event()
        end = object()

        async def pump() -> None:
            agen = self.astream(prompts, sampling)
            try:
                async for result in agen:
                    while not stop.is_set():
                        try:
                            results.put_nowait(result)
                            break
                        except queue.Full:  # the consumer is behind: wait without blocking the loop
                            await asyncio.sleep(0.01)
                    if stop.is_set():
                        return
            finally:
                await agen.aclose()

        def run() -> None:
            try:
                asyncio.run(pump())
                results.put(end)
            except BaseException as err:  # noqa: BLE001 - re-raised in the consumer thread
                results.put(err)

        thread = threading.Thread(target=run, name="rufus-server-generator", daemon=True)
        thread.start()
        try:
            while True:
                item = results.get()
                if item is end:
                    return
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            stop.set()
            thread.join(timeout=30)
