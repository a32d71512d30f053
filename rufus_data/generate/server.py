"""The `server` backend: any OpenAI-compatible chat endpoint (vLLM first of all).

One request per prompt asks for all `n` samples with `seed = prompt seed` (vLLM seeds the
children `seed + i`, see sampling.py), so samples differ and runs reproduce. Requests run
asynchronously with bounded concurrency, are retried with exponential backoff on transient
errors (connection problems, 408/429/5xx), and are spread over several base URLs: each goes
to the URL with the fewest requests in flight, ties broken round-robin. A URL that refuses
connections `drop_after` times in a row is dropped for the rest of the run (logged) while
another URL still answers.

`return_token_ids` is a vLLM extension; a strict OpenAI-compatible endpoint answers 400 naming
it. Then the request is sent again without it, once, and the rest of the run leaves it out;
token counts then come from each choice's logprobs (one entry per generated token)."""

from __future__ import annotations

import asyncio
import itertools
import queue
import random
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import httpx

from rufus_data.console import console
from rufus_data.errors import RufusError
from rufus_data.generate.base import Completion, Generator, Prompt, PromptResult
from rufus_data.generate.sampling import SamplingParams

TRANSIENT_STATUS = {408, 429, 500, 502, 503, 504}


@dataclass
class ServerConfig:
    base_urls: list[str]
    model: str
    concurrency: int = 32  # requests in flight over all URLs
    max_retries: int = 5
    backoff_s: float = 0.5  # first retry delay; doubles each attempt (with jitter)
    timeout_s: float = 600.0
    drop_after: int = 3  # consecutive connection failures after which a URL is dropped
    logprobs: bool = True
    api_key: str | None = None


def normalise_base_url(url: str) -> str:
    """Accept `http://host:port`, `.../v1` or `.../v1/`; return the part before /v1."""
    url = url.rstrip("/")
    return url.removesuffix("/v1")


class ServerGenerator(Generator):
    def __init__(self, config: ServerConfig):
        if not config.base_urls:
            raise RufusError("the server backend needs at least one --base-url (e.g. http://127.0.0.1:8000)")
        self.config = config
        self.model = config.model
        self.base_urls = [normalise_base_url(u) for u in config.base_urls]
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
            "messages": prompt.messages,
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
        last_error = ""
        attempt = 0
        while True:
            url = self._pick_url()
            self.in_flight[url] += 1
            self.sent[url] += 1
            try:
                response = await client.post(f"{url}/v1/chat/completions", json=body)
            except httpx.TransportError as err:
                last_error = f"{url}: {type(err).__name__}: {err}"
                if isinstance(err, httpx.ConnectError):
                    self._connection_failed(url)
            else:
                self._connect_failures[url] = 0
                if response.status_code == 200:
                    data = response.json()
                    completions = self.parse_choices(data, body.get("seed"))
                    if len(completions) != sampling.n:
                        raise RufusError(
                            f"{url} returned {len(completions)} completions for prompt {prompt.id}, asked for n={sampling.n}"
                        )
                    return PromptResult(prompt, completions)
                if self._refuses_token_ids(response, body):
                    if self.send_token_ids:
                        self.send_token_ids = False
                        console.print(f"[yellow]{url} does not take return_token_ids: leaving it out for this run; "
                                      "token counts come from the logprobs[/]")
                    del body["return_token_ids"]
                    self.retries += 1
                    continue  # at once, and not counted against max_retries
                if response.status_code not in TRANSIENT_STATUS:
                    raise RufusError(
                        f"{url} refused the request for prompt {prompt.id} (HTTP {response.status_code}): "
                        f"{response.text[:500]}"
                    )
                last_error = f"{url}: HTTP {response.status_code}: {response.text[:200]}"
            finally:
                self.in_flight[url] -= 1
            if attempt >= self.config.max_retries:
                break
            delay = self.config.backoff_s * 2**attempt
            attempt += 1
            self.retries += 1
            await asyncio.sleep(delay * random.uniform(0.8, 1.2))
        raise RufusError(
            f"prompt {prompt.id}: the server did not answer after {self.config.max_retries + 1} attempts "
            f"(last error: {last_error}); is it up? check --base-url"
        )

    async def astream(self, prompts: Iterable[Prompt], sampling: SamplingParams):
        """Async iterator of results as they complete; at most `concurrency` requests in flight."""
        prompts = iter(prompts)
        headers = {"Authorization": f"Bearer {self.config.api_key}"} if self.config.api_key else {}
        limits = httpx.Limits(max_connections=self.config.concurrency, max_keepalive_connections=self.config.concurrency)
        timeout = httpx.Timeout(self.config.timeout_s, connect=10.0)
        async with httpx.AsyncClient(timeout=timeout, limits=limits, headers=headers) as client:
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
