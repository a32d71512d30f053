"""The one generation interface: prompts, sampling -> `n` completions per prompt.

Every backend (`server`, `vllm`, `hf`) implements `Generator.stream`, which yields each prompt's
completions as soon as they are done (in any order), so callers can append results to a
resumable journal as they arrive. `generate` is the collect-all convenience on top."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from rufus_data.generate.sampling import SamplingParams


@dataclass(frozen=True)
class Prompt:
    """One prompt to complete: a stable id (seeds derive from it) and chat messages."""

    id: str
    messages: list[dict]


@dataclass
class Completion:
    """One sampled completion."""

    text: str
    token_ids: list[int]
    finish_reason: str  # "stop" (end of sequence or stop string) or "length" (max_tokens reached)
    seed: int | None = None
    logprobs: list[float] | None = None  # log-probability of each generated token, where available
    token_count: int | None = None  # when token_ids are unknown (a server without return_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids) if self.token_ids or self.token_count is None else self.token_count


@dataclass
class PromptResult:
    """All `n` completions of one prompt."""

    prompt: Prompt
    completions: list[Completion] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return sum(c.num_tokens for c in self.completions)


class Generator:
    """Base class of the backends; `model` is what goes into rollouts and reports."""

    model: str = ""

    def stream(self, prompts: Iterable[Prompt], sampling: SamplingParams) -> Iterator[PromptResult]:
        """Yield one PromptResult per prompt as soon as it is complete (order not guaranteed)."""
        raise NotImplementedError

    def generate(self, prompts: Iterable[Prompt], sampling: SamplingParams) -> list[PromptResult]:
        """All results, in the order of `prompts`."""
        prompts = list(prompts)
        done = {r.prompt.id: r for r in self.stream(prompts, sampling)}
        return [done[p.id] for p in prompts]

    def close(self) -> None:
        """Release what the backend holds (servers it started, models in memory)."""

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()
