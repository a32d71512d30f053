"""Rufus's async GRPO trainer: TRL's AsyncGRPOTrainer, with the rollout worker's death on the
server's context-length answer said as what it is (rollout_failures.py)."""

from __future__ import annotations

from collections.abc import Callable

from trl.experimental.async_grpo import AsyncGRPOTrainer

from rufus_train.grpo.rollout_failures import context_length_explained


class RufusAsyncGRPOTrainer(AsyncGRPOTrainer):
    """AsyncGRPOTrainer; `longest_prompt()` gives the data's longest prompt in tokens (computed
    only when a failure is explained)."""

    def __init__(self, *args, longest_prompt: Callable[[], int], **kwargs):
        super().__init__(*args, **kwargs)
        self.longest_prompt = longest_prompt

    def train(self, *args, **kwargs):
        with context_length_explained(self.args.vllm_server_base_url, self.longest_prompt,
                                      self.args.max_completion_length, self.args.max_tool_calling_iterations):
            return super().train(*args, **kwargs)
