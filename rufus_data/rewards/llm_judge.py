"""An async LLM-as-judge reward against an OpenAI-compatible server (vLLM, SGLang, TGI, OpenAI, ...).

The connection is `base_url` and `model` when given (an evaluation suite pins its judge this way); otherwise
it comes from the environment, read when the reward runs (so a pickled reward follows the worker's
environment): JUDGE_BASE_URL (default http://localhost:8001/v1), JUDGE_MODEL (default: the first model the
server lists). The key is always JUDGE_API_KEY (default EMPTY), never a constructor argument, so it never
lands in a config or a results file. Everything else is a fixed default that tests may
override: 16 requests in flight, 120 s timeout, 2 retries after 1 s then 2 s, 2048 generated tokens, and a
parsed 1-10 score >= 7 gives 1.0. A request that still fails, or an answer with no parsable score, gives
None (excluded) and is counted through `log_metric`; the batch goes on.

TRL (>= 1.x) runs async reward functions on its own event loop (`is_async_callable` recognises an
instance whose `__call__` is `async def`).
"""

from __future__ import annotations

import asyncio
import os
import re
import time
from collections.abc import Awaitable, Callable

import httpx

from rufus_data.rewards.contract import RewardFunction, is_missing, rows_from_kwargs

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


def judge_connection(base_url: str | None = None, model: str | None = None) -> tuple[str, str | None, str]:
    """(base URL, model or None = the server's first, API key): the arguments first, then JUDGE_* variables."""
    base = base_url or os.environ.get("JUDGE_BASE_URL") or DEFAULT_JUDGE_BASE_URL
    model = model or os.environ.get("JUDGE_MODEL") or None
    return base.rstrip("/"), model, os.environ.get("JUDGE_API_KEY") or "EMPTY"


class LLMJudgeReward(RewardFunction):
    def __init__(
        self,
        reference_column: str = "reference",
        only_label: str | None = None,
        base_url: str | None = None,
        model: str | None = None,
        threshold: float = 7,
        concurrency: int = 16,
        timeout_s: float = 120.0,
        retries: int = 2,
        backoff_s: tuple[float, ...] = (1.0, 2.0),
        max_tokens: int = 2048,
        prompt_template: str = JUDGE_PROMPT,
        sleep: Callable[[float], Awaitable] = asyncio.sleep,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.reference_column = reference_column
        self.base_url = base_url
        self.model = model
        self.threshold = threshold
        self.concurrency = concurrency
        self.timeout_s = timeout_s
        self.retries = retries
        self.backoff_s = tuple(backoff_s)
        self.max_tokens = max_tokens
        self.prompt_template = prompt_template
        self.sleep = sleep
        self.clock = clock
        self.name = "llm_judge"
        super().__init__(only_label=only_label)

    # -- connection (explicit arguments, else the environment read at call time)
    def connection(self) -> tuple[str, str | None, str]:
        return judge_connection(self.base_url, self.model)

    async def __call__(self, prompts=None, completions=None, completion_ids=None, **kwargs) -> list[float | None]:
        completions = list(completions or [])
        rows = rows_from_kwargs(len(completions), kwargs)
        prompts = list(prompts) if prompts is not None else [None] * len(completions)
        texts, closed = self.answer_texts(completions)
        applies = self.applies(rows)
        log_metric = kwargs.get("log_metric")
        base_url, model, api_key = self.connection()
        counts = {"failed": 0, "unparsable": 0}
        started = self.clock()
        semaphore = asyncio.Semaphore(self.concurrency)
        headers = {"Authorization": f"Bearer {api_key}"}
        # trust_env=False: the judge is a server you run; never route it through a proxy from the environment
        async with httpx.AsyncClient(base_url=base_url, headers=headers, timeout=self.timeout_s, trust_env=False) as client:
            if model is None and any(applies):
                model = await self._first_model(client)

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
                    answer = await self._request(client, model, content)
                if answer is None:
                    counts["failed"] += 1
                    return None
                score = parse_score(answer)
                if score is None:
                    counts["unparsable"] += 1
                    return None
                return 1.0 if score >= self.threshold else 0.0

            results = await asyncio.gather(*(judge(*args) for args in zip(prompts, texts, closed, rows, applies)))
        if log_metric is not None:
            log_metric("llm_judge/failed", float(counts["failed"]))
            log_metric("llm_judge/unparsable", float(counts["unparsable"]))
            log_metric("llm_judge/seconds", float(self.clock() - started))
        self.log_counts(log_metric, texts, closed, results)
        return list(results)

    async def _first_model(self, client: httpx.AsyncClient) -> str | None:
        try:
            response = await client.get("/models")
            response.raise_for_status()
            return response.json()["data"][0]["id"]
        except (httpx.HTTPError, KeyError, IndexError, ValueError):
            return None  # every request will then fail and be counted

    async def _request(self, client: httpx.AsyncClient, model: str | None, content: str) -> str | None:
        """One judged answer's text, with retries; None when every attempt failed."""
        body = {"model": model, "messages": [{"role": "user", "content": content}], "max_tokens": self.max_tokens,
                "temperature": 0.0}
        for attempt in range(self.retries + 1):
            try:
                response = await client.post("/chat/completions", json=body)
                response.raise_for_status()
                return response.json()["choices"][0]["message"]["content"] or ""
            except (httpx.HTTPError, KeyError, IndexError, ValueError, TypeError):
                if attempt == self.retries:
                    return None
                delay = self.backoff_s[min(attempt, len(self.backoff_s) - 1)] if self.backoff_s else 0.0
                await self.sleep(delay)
        return None
