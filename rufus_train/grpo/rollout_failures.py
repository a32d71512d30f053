"""What a user sees when async GRPO's rollout worker dies on the server's context-length answer.

TRL's rollout worker (a spawned process) retries a failed /v1/completions request 30 times, then
dies; the trainer reports it as "Rollout worker child has failed; see chained exception." (or,
dying earlier, "AsyncRolloutWorker child exited during init"), with the reason as text inside a
chained traceback: `ClientResponseError: 400, message='Bad Request'`, vLLM's own explanation
(its response body) lost. vLLM answers 400 to a completion request whose prompt plus max_tokens
does not fit its context, so that is said instead, with the numbers: the longest prompt, the
`max_completion_length`, and the server's `max_model_len` read again when it happens."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Iterator

from rufus_data.base.errors import RufusError
from rufus_data.generate.context import server_max_model_len

WORKER_DIED = ("Rollout worker child has failed", "AsyncRolloutWorker child exited during init")
COMPLETIONS_400 = re.compile(r"ClientResponseError: 400\b.*?url='([^']*/v1/completions)'", re.DOTALL)


def chain_text(err: BaseException) -> str:
    """The messages of an exception and of every exception it was raised from."""
    texts, seen = [], set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        texts.append(str(err))
        err = err.__cause__ or err.__context__
    return "\n".join(texts)


def context_length_400(err: BaseException) -> str | None:
    """The completions URL when `err` is TRL's rollout-worker death on an HTTP 400 from it."""
    text = chain_text(err)
    found = COMPLETIONS_400.search(text)
    return found.group(1) if found and any(died in text for died in WORKER_DIED) else None


def explain_context_400(url: str, server_url: str, longest_prompt: int, max_completion_length: int,
                        max_tool_calling_iterations: int | None) -> RufusError:
    """The context-length refusal, with the numbers."""
    limit = server_max_model_len(server_url)
    need = longest_prompt + max_completion_length
    numbers = (f"the longest prompt of the data is {longest_prompt} tokens, max_completion_length is "
               f"{max_completion_length} ({need} in all), and the server's max_model_len is "
               f"{limit if limit is not None else 'unknown (it no longer answers GET /v1/models)'}")
    if limit is not None and need > limit:
        why = ("a first turn no longer fits: the server's context is smaller than when the run was checked at start "
               "(restarted with a smaller --max-model-len?)")
    else:
        turns = f" (up to max_tool_calling_iterations: {max_tool_calling_iterations})" if max_tool_calling_iterations else ""
        why = (f"a later turn's prompt grew past it: a multi-turn rollout's prompt holds every earlier turn and tool "
               f"result{turns}, so a prompt that fitted at the start can exceed max_model_len - max_completion_length")
    return RufusError(
        f"async GRPO stopped: the vLLM server refused a completion request with HTTP 400 ({url}), vLLM's answer when a "
        f"prompt plus max_tokens exceeds its context, which TRL's rollout worker retried until it gave up; {numbers}; "
        f"{why}. Fix: serve a longer context (rufus-train serve --max-model-len N), lower max_completion_length, or "
        "fewer tool-calling turns (max_tool_calling_iterations). (TRL reported it as the rollout worker's exit.)"
    )


@contextlib.contextmanager
def context_length_explained(server_url: str, longest_prompt: Callable[[], int], max_completion_length: int,
                             max_tool_calling_iterations: int | None) -> Iterator[None]:
    """Around an async GRPO run: the rollout worker's death on the context-length 400 becomes a
    RufusError with the numbers (`longest_prompt` is only computed then); any other error passes."""
    try:
        yield
    except RuntimeError as err:
        url = context_length_400(err)
        if url is None:
            raise
        raise explain_context_400(url, server_url, longest_prompt(), max_completion_length,
                                  max_tool_calling_iterations) from err
