"""The DAPO soft overlong penalty: 0 up to `max_length - cache`, linear down to -1 at `max_length`."""

from __future__ import annotations

from rufus_data.base.errors import RufusError
from rufus_data.rewards.contract import RewardFunction, rows_from_kwargs


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

    def __init__(self, max_length: int, cache: int, only_label: str | None = None):
        if not 0 <= cache <= max_length:
            raise RufusError(f"overlong_penalty: need 0 <= cache ({cache}) <= max_length ({max_length})")
        self.max_length = max_length
        self.cache = cache
        self.name = "overlong_penalty"
        super().__init__(only_label=only_label)

    def __call__(self, prompts=None, completions=None, completion_ids=None, **kwargs):
        if completion_ids is None:
            raise RufusError("overlong_penalty needs completion_ids (token ids per completion), as TRL passes them; "
                             "a server that returns no token ids cannot be scored by it")
        applies = self.applies(rows_from_kwargs(len(completion_ids), kwargs))
        return [overlong_penalty(len(ids), self.max_length, self.cache) if ok else None
                for ids, ok in zip(completion_ids, applies, strict=True)]
