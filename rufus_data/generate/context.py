"""Check, before the first request, that the longest prompt plus `max_tokens` fits the server.

vLLM answers HTTP 400 when `max_tokens` alone exceeds its context, but when only the sum does it
answers 200 and silently cuts the output (`finish_reason: length`), which would quietly turn
into wrong rewards. So read `max_model_len` from `GET /v1/models` and refuse at once.
Used by `filter` / `pairs` and by the train stages that generate through a server."""

from __future__ import annotations

import time

import httpx

from rufus_data.errors import RufusError


def server_max_model_len(base_url: str, model: str | None = None, retries: int = 3, delay_s: float = 0.5) -> int | None:
    """`max_model_len` of `model` (or the first model) served at base_url; None if unreachable or not reported."""
    url = base_url.rstrip("/")
    url = url if url.endswith("/v1") else f"{url}/v1"
    for attempt in range(retries):
        try:
            response = httpx.get(f"{url}/models", timeout=5.0)
            if response.status_code == 200:
                models = response.json().get("data") or []
                chosen = [m for m in models if m.get("id") == model] or models
                return chosen[0].get("max_model_len") if chosen else None
        except (httpx.HTTPError, ValueError):
            pass
        if attempt + 1 < retries:
            time.sleep(delay_s)
    return None


def check_context_fits(
    base_url: str,
    longest_prompt_tokens: int,
    max_tokens: int,
    model: str | None = None,
    retries: int = 3,
    delay_s: float = 0.5,
) -> str:
    """Return "ok" if prompt + max_tokens fits, "skipped" if the server could not be asked;
    raise RufusError with both numbers and the fix if it does not fit."""
    limit = server_max_model_len(base_url, model, retries=retries, delay_s=delay_s)
    if limit is None:
        return "skipped"
    need = longest_prompt_tokens + max_tokens
    if need > limit:
        raise RufusError(
            f"the longest prompt ({longest_prompt_tokens} tokens) plus max_tokens ({max_tokens}) is {need} tokens, "
            f"more than the server's max_model_len={limit} at {base_url}: vLLM would silently cut the outputs. "
            f"Restart the server with a larger --max-model-len (at least {need}), or lower max_tokens to at most "
            f"{max(limit - longest_prompt_tokens, 0)} (--max-tokens)"
        )
    return "ok"
