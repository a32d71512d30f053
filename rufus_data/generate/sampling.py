"""Sampling parameters shared by every backend, and the per-sample seeds derived from a run seed.

Seeds: prompt `pid` in a run with seed `s` gets `prompt_seed(s, pid)` (a stable hash, so it does
not depend on the order or the company of the prompt), and its sample `i` gets
`prompt_seed + i`. That is exactly how vLLM seeds the children of an `n > 1` request, so the
server backend sends one request per prompt with `seed=prompt_seed` and the samples still
differ; the hf backend seeds its own generator the same way."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass

from rufus_data.base.errors import RufusError

SEED_MODULUS = 2**31 - 1024  # room for + sample index, and inside every backend's int range


@dataclass(frozen=True)
class SamplingParams:
    """What a backend needs to sample; `n` completions per prompt."""

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 = off
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    max_tokens: int = 512
    seed: int | None = 0  # None: not reproducible

    def __post_init__(self) -> None:
        problems = []
        if self.n < 1:
            problems.append(f"n={self.n} must be >= 1")
        if self.temperature < 0:
            problems.append(f"temperature={self.temperature} must be >= 0")
        if not 0 < self.top_p <= 1:
            problems.append(f"top_p={self.top_p} must be in (0, 1]")
        if self.top_k < 0:
            problems.append(f"top_k={self.top_k} must be >= 0 (0 turns it off)")
        if not 0 <= self.min_p < 1:
            problems.append(f"min_p={self.min_p} must be in [0, 1)")
        if self.repetition_penalty <= 0:
            problems.append(f"repetition_penalty={self.repetition_penalty} must be > 0")
        if self.max_tokens < 1:
            problems.append(f"max_tokens={self.max_tokens} must be >= 1")
        if problems:
            raise RufusError("bad sampling parameters: " + "; ".join(problems))

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    def prompt_seed(self, prompt_id: str) -> int | None:
        return None if self.seed is None else prompt_seed(self.seed, prompt_id)


def prompt_seed(run_seed: int, prompt_id: str) -> int:
    """A stable seed for one prompt of a run: independent of order, batch and process."""
    digest = hashlib.sha256(f"{run_seed}\x00{prompt_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big") % SEED_MODULUS


def sample_seed(run_seed: int, prompt_id: str, index: int) -> int:
    """Seed of sample `index` of a prompt (vLLM's rule for the children of an n>1 request)."""
    return prompt_seed(run_seed, prompt_id) + index
