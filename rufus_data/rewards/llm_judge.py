"""An async LLM-as-judge reward against an OpenAI-compatible server (vLLM, SGLang, TGI, OpenAI, ...).

The connection is `base_url` and `model` when given (an evaluation suite pins its judge this way); otherwise
it comes from the environment, read when the reward runs (so a pickled reward follows the worker's
environment): JUDGE_BASE_URL (default http://localhost:8001/v1), JUDGE_MODEL (default: the first model the
server lists). The key is always JUDGE_API_KEY (default EMPTY), never a constructor argument, so it never
lands in a config or a results file. Requests go through the shared client (rufus_data/models/openai_api.py: its
proxy rule, retry policy and errors). Everything else is a fixed default that tests may override: 16
requests in flight, 120 s timeout, 2 retries after about 1 s then 2 s (jittered; at most 300 s per
answer in all), 2048 generated tokens, and a parsed 1-10 score >= 7 gives 1.0. A request that still
fails, the server refusing one request (HTTP 400, 413, 422: a prompt too long for the judge, say; its
message is printed once), or an answer with no parsable score gives None (excluded) and is counted
through `log_metric`; the batch goes on. Any other 4xx (an unknown model, a wrong key) stops the
call at once with the server's message.

TRL (>= 1.x) runs async reward functions on its own event loop (`is_async_callable` recognises an
instance whose `__call__` is `async def`).
"""

from __future__ import annotations

import asyncio
import os
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import httpx

from rufus_data.base.console import console
from rufus_data.models.openai_api import (
    JUDGE_KEY_VARIABLE,
    GaveUp,
    RetryPolicy,
    ServerRefused,
    api_key,
    arequest,
    async_client,
    model_list,
    v1_url,
)
from rufus_data.rewards.contract import RewardFunction, is_missing

JUDGE_PROMPT = """You are grading an answer to a task. Judge correctness first, then helpfulness.

[Task]
{prompt}

[Reference answer]
{reference}

[Answer to grade]
{answer}

Reply with a short justification, then a final line of the form "Score: N" where N is an integer from 1
(wrong or useless) to 10 (fully correct and helpful)."""

_SCORE_PATTERNS = (
    re.compile(r"score\s*[:=]?\s*\**\s*\[*\s*(\d+(?:\.\d+)?)", re.IGNORECASE),
    re.compile(r"\[\[\s*(\d+(?:\.\d+)?)\s*\]\]"),
    re.compile(r"\b(\d+(?:\.\d+)?)\s*/\s*10\b"),
)


def parse_score(text: str) -> float | None:
    """The judge's 1-10 score (last `Score: N`, else `[[N]]`, else `N/10`); None when there is none."""
    for pattern in _SCORE_PATTERNS:
        matches = pattern.findall(text or "")
        if matches:
            value = float(matches[-1])
            return value if 0 <= value <= 10 else None
    return None


def _text(value) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    return "\n\n".join(f"{m.get('role', 'user')}: {m.get('content') or ''}" for m in value if isinstance(m, dict))


DEFAULT_JUDGE_BASE_URL = "http://localhost:8001/v1"
JUDGE_TOTAL_S = 300.0  # one judged answer, every attempt and wait together
REFUSED_ONE_REQUEST = {400, 413, 422}  # statuses about this request only: that sample is unscored


def judge_connection(base_url: str | None = None, model: str | None = None) -> tuple[str, str | None, str]:
    """(API base `.../v1`, model or None = the server's first, API key): the arguments first, then JUDGE_* variables."""
    base = base_url or os.environ.get("JUDGE_BASE_URL") or DEFAULT_JUDGE_BASE_URL
    model = model or os.environ.get("JUDGE_MODEL") or None
    return v1_url(base), model, api_key(JUDGE_KEY_VARIABLE, default="EMPTY")


@dataclass(eq=False)
class LLMJudgeReward(RewardFunction):
    """1.0 when the judge scores an answer >= `threshold`; None when no score came back (excluded)."""

    reference_column: str = "reference"
    only_label: str | None = None
    base_url: str | None = None
    model: str | None = None
    threshold: float = 7
    concurrency: int = 16
    timeout_s: float = 120.0
    retries: int = 2
    backoff_s: float = 1.0
    max_tokens: int = 2048
    prompt_template: str = JUDGE_PROMPT
    sleep: Callable[[float], Awaitable] = asyncio.sleep
    clock: Callable[[], float] = time.monotonic
    name: str = field(default="llm_judge", init=False)

    def __post_init__(self):
        super().__init__(only_label=self.only_label)
        self._last_failure: str | None = None

    @property
    def last_failure(self) -> str | None:
        """Why the latest request that failed failed (the measured cause a dead judge is reported with)."""
        return self._last_failure

    # -- connection (explicit arguments, else the environment read at call time)
    def connection(self) -> tuple[str, str | None, str]:
        return judge_connection(self.base_url, self.model)

    async def __call__(self, prompts=None, completions=None, completion_ids=None, **kwargs) -> list[float | None]:
        prompts, texts, closed, rows, applies = self.call_inputs(prompts, completions, kwargs)
        log_metric = kwargs.get("log_metric")
        base_url, model, key = self.connection()
        counts = {"failed": 0, "unparsable": 0}
        started = self.clock()
        semaphore = asyncio.Semaphore(self.concurrency)
        refused: list[str] = []  # the servers' messages of refused requests (the first is printed)
        async with async_client([base_url], key=key, timeout_s=self.timeout_s, connections=self.concurrency) as client:
            if model is None and any(applies):
                model = await self._first_model(client, base_url)

            async def judge(prompt, text, ok, row, scored) -> float | None:
                if not scored:
                    return None
                if not ok:
                    return 0.0  # an unclosed <think> has no answer
                reference = row.get(self.reference_column)
                if is_missing(reference):
                    reference = row.get("solution")
                content = self.prompt_template.format(
                    prompt=_text(prompt), answer=text, reference="" if is_missing(reference) else str(reference)
                )
                async with semaphore:
                    answer = await self._request(client, base_url, model, content, refused)
                if answer is None:
                    counts["failed"] += 1
                    return None
                score = parse_score(answer)
                if score is None:
                    counts["unparsable"] += 1
                    return None
                return 1.0 if score >= self.threshold else 0.0

            results = await _all_or_none(judge(*args) for args in zip(prompts, texts, closed, rows, applies))
        if log_metric is not None:
            log_metric("llm_judge/failed", float(counts["failed"]))
            log_metric("llm_judge/unparsable", float(counts["unparsable"]))
            log_metric("llm_judge/seconds", float(self.clock() - started))
        self.log_counts(log_metric, texts, closed, results)
        return list(results)

    @property
    def retry(self) -> RetryPolicy:
        return RetryPolicy(attempts=self.retries + 1, backoff_s=self.backoff_s, total_s=JUDGE_TOTAL_S)

    async def _first_model(self, client: httpx.AsyncClient, base_url: str) -> str | None:
        try:
            served = model_list(await arequest(client, "GET", f"{base_url}/models", self.retry, sleep=self.sleep))
        except GaveUp:
            return None  # every request will then fail and be counted
        return served[0]["id"] if served else None

    async def _request(self, client: httpx.AsyncClient, base_url: str, model: str | None, content: str,
                       refused: list[str]) -> str | None:
        """One judged answer's text (the shared retry policy); None when it failed or was refused."""
        body = {"model": model, "messages": [{"role": "user", "content": content}], "max_tokens": self.max_tokens,
                "temperature": 0.0}
        try:
            response = await arequest(client, "POST", f"{base_url}/chat/completions", self.retry, model=model,
                                      json=body, sleep=self.sleep)
            return response.json()["choices"][0]["message"]["content"] or ""
        except GaveUp as err:
            self._last_failure = str(err)
            return None
        except ServerRefused as err:
            if err.status not in REFUSED_ONE_REQUEST:
                raise
            if not refused:
                console.print(f"[yellow]llm_judge: {err}; that sample is unscored[/]")
            refused.append(err.server_message)
            return None
        except (ValueError, KeyError, IndexError, TypeError):
            self._last_failure = f"{base_url}/chat/completions answered 200 with no chat completion"
            return None  # counted as failed


async def _all_or_none(coroutines) -> list:
    """Every result, in order; on the first error the other requests are cancelled before it is raised."""
    tasks = [asyncio.ensure_future(c) for c in coroutines]
    try:
        return await asyncio.gather(*tasks)
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise
