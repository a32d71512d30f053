"""The DAPO soft overlong penalty: 0 up to `max_length - cache`, linear down to -1 at `max_length`."""

from __future__ import annotations

from rufus_data.errors import RufusError
from rufus_data.rewards.contract import RewardFunction


def overlong_penalty(length: int, max_length: int, cache: int) -> float:
    start = max_length - cache
    if length <= start:
        return 0.0
    if length >= max_length or cache <= 0:
        return -1.0
    return -(length - start) / cache


class OverlongPenalty(RewardFunction):
    """Scores by completion length in tokens (`completion_ids`); combine it with a correctness reward."""

    strip_think = False

    def __init__(self, max_length: int, cache: int):
        if not 0 <= cache <= max_length:
            raise RufusError(f"overlong_penalty: need 0 <= cache ({cache}) <= max_length ({max_length})")
        self.max_length = max_length
        self.cache = cache
        self.name = "overlong_penalty"
        super().__init__()

    def __call__(self, prompts=None, completions=None, completion_ids=None, **kwargs):
        if completion_ids is None:
            raise RufusError("overlong_penalty needs completion_ids (token ids per completion), as TRL passes them")
        return [overlong_penalty(len(ids), self.max_length, self.cache) for ids in completion_ids]
