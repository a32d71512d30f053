"""Check, before the first request, that the longest prompt plus `max_tokens` fits the server.

vLLM answers HTTP 400 when `max_tokens` alone exceeds its context, but when only the sum does it
answers 200 and silently cuts the output (`finish_reason: length`), which would quietly turn
into wrong rewards. So read `max_model_len` from `GET /v1/models` and refuse at once.
`check_fits` is the one comparison (and message) used by `filter` / `pairs` and by the train
stages (rufus_train/grpo/length_checks.py)."""

from __future__ import annotations

from collections.abc import Sequence

from rufus_data.base.errors import RufusError
from rufus_data.models.openai_api import SERVER_KEY_VARIABLE, RetryPolicy, api_key, served_models


def server_max_model_len(base_url: str, model: str | None = None, retries: int = 3, delay_s: float = 0.5) -> int | None:
    """`max_model_len` of `model` (or the first model) served at base_url; None if unreachable or not reported.
    `retries` attempts in all (the shared policy, from `delay_s`), within half a minute."""
    try:
        models = served_models(base_url, key=api_key(SERVER_KEY_VARIABLE),
                               retry=RetryPolicy(attempts=retries, backoff_s=delay_s, total_s=30.0))
    except RufusError:
        return None
    chosen = [m for m in models if m.get("id") == model] or models
    return chosen[0].get("max_model_len") if chosen else None


def check_fits(
    max_tokens: int,
    limit: int,
    *,
    longest_prompt_tokens: int | None = None,
    limit_name: str = "the server's max_model_len",
    at: str = "",
    max_tokens_name: str = "max_tokens",
    max_tokens_flag: str = "",
    fixes: Sequence[str] = (),
) -> None:
    """The one context check, shared by `filter`/`pairs` and the train stages: raise RufusError
    with both numbers and the fixes when `longest_prompt_tokens + max_tokens` exceeds `limit`.
    With `longest_prompt_tokens=None` (prompts not tokenized yet) it only refuses a `max_tokens`
    that leaves no room for any prompt. `limit_name`/`at` say what the limit is and where it
    came from; `fixes` are extra ways out, after "lower max_tokens" (`max_tokens_flag`: its option)."""
    flag = f" ({max_tokens_flag})" if max_tokens_flag else ""
    if longest_prompt_tokens is None:
        if max_tokens < limit:
            return
        problem = f"{max_tokens_name} ({max_tokens}) >= {limit_name} ({limit}){at}: no prompt would fit"
        ways = [f"lower {max_tokens_name} below {limit}{flag}", *fixes]
    else:
        need = longest_prompt_tokens + max_tokens
        if need <= limit:
            return
        problem = (
            f"the longest prompt ({longest_prompt_tokens} tokens) plus {max_tokens_name} ({max_tokens}) is {need} "
            f"tokens, more than {limit_name} ({limit}){at}: completions would be cut silently (vLLM answers 200 "
            "with finish_reason=length)"
        )
        ways = [f"lower {max_tokens_name} to at most {max(limit - longest_prompt_tokens, 0)}{flag}", *fixes]
    raise RufusError(f"{problem}. Fix: {'; or '.join(ways)}")


def check_context_fits(
    base_url: str,
    longest_prompt_tokens: int,
    max_tokens: int,
    model: str | None = None,
    retries: int = 3,
    delay_s: float = 0.5,
) -> str:
    """Return "ok" if prompt + max_tokens fits the server at base_url, "skipped" if the server could
    not be asked; raise RufusError with both numbers and the fix (`check_fits`) if it does not fit."""
    limit = server_max_model_len(base_url, model, retries=retries, delay_s=delay_s)
    if limit is None:
        return "skipped"
    check_fits(
        max_tokens,
        limit,
        longest_prompt_tokens=longest_prompt_tokens,
        at=f" at {base_url}",
        max_tokens_flag="--max-tokens",
        fixes=[f"restart the server with a larger --max-model-len (at least {longest_prompt_tokens + max_tokens})"],
    )
    return "ok"
