"""What a GRPO run's prompts and completions must fit, checked before the model loads: the
completion length against the vLLM server's `max_model_len` (or the model's own
`max_position_embeddings` when the trainer generates), and, once the prompts are tokenized, the
longest prompt plus the completion length (vLLM would otherwise cut completions silently)."""

from __future__ import annotations

import warnings

from rufus_data.console import console
from rufus_data.errors import RufusError
from rufus_data.generate.context import check_fits, server_max_model_len
from rufus_data.models import read_model_config
from rufus_train.grpo.config import GRPOStageConfig


def check_completion_budget(
    base_url: str, max_completion_length: int, token_budget: int | None = None, retries: int = 3, delay_s: float = 0.5
) -> int | None:
    """Before the tokenizer, dataset or model load: read the server's max_model_len and refuse a
    completion length that cannot fit. Returns max_model_len, or None when the server did not
    answer (best effort: the check is reported as skipped and the run goes on)."""
    limit = server_max_model_len(base_url, retries=retries, delay_s=delay_s)
    if limit is None:
        console.print(f"[yellow]completion-length check skipped:[/] no max_model_len from {base_url}/v1/models")
        return None
    check_fits(
        max_completion_length, limit, at=f" at {base_url}", max_tokens_name="max_completion_length",
        fixes=["restart the server with a larger --max-model-len (rufus-train serve --max-model-len N)"],
    )
    if token_budget is not None and token_budget < limit:
        warnings.warn(
            f"token_budget ({token_budget}) is below the server's max_model_len ({limit}): a rollout longer than "
            "the budget fits in no micro-batch row and is dropped. Leave token_budget null to use max_model_len",
            UserWarning,
            stacklevel=2,
        )
    console.print(
        f"server max_model_len {limit}: completions up to {max_completion_length} tokens leave "
        f"{limit - max_completion_length} tokens for the prompt"
    )
    return limit


def check_prompt_fits(longest_prompt: int, max_completion_length: int, limit: int, where: str) -> None:
    """After tokenization: the longest prompt plus max_completion_length must fit `limit` (vLLM
    would otherwise cut the completion silently; transformers would run past the positions)."""
    check_fits(
        max_completion_length, limit, longest_prompt_tokens=longest_prompt, limit_name=where,
        max_tokens_name="max_completion_length", fixes=["drop long prompts from the shards", "serve a longer context"],
    )


def check_token_budget(longest_prompt: int, max_completion_length: int, token_budget: int | None) -> None:
    """Async GRPO, after tokenization: a set `token_budget` (> 0) must hold the longest prompt plus
    max_completion_length. A longer sample fits in no micro-batch row: TRL drops it with a
    warning, and every rollout of that prompt is generated for nothing."""
    if token_budget is None or token_budget <= 0:
        return  # null: TRL uses the server's max_model_len (checked above); <= 0: no token budgeting
    need = longest_prompt + max_completion_length
    if need > token_budget:
        raise RufusError(
            f"token_budget ({token_budget}) is below the longest prompt ({longest_prompt} tokens) plus "
            f"max_completion_length ({max_completion_length}) = {need}: such a rollout fits in no micro-batch row and "
            f"async GRPO drops it after generating it. Raise token_budget to at least {need}, leave it null (the "
            f"server's max_model_len), or lower max_completion_length to at most {max(token_budget - longest_prompt, 0)}"
        )


def context_limit(config: GRPOStageConfig, check: bool) -> tuple[int | None, str]:
    """The context a prompt plus its completion must fit: the server's max_model_len when a server
    generates (asked with a few short retries; None = skipped), else the model's
    max_position_embeddings from its config.json. With check=True, also refuse a
    max_completion_length that leaves no room for any prompt."""
    url = config.server_url
    if url:
        if check:
            limit = check_completion_budget(
                url, config.max_completion_length, config.token_budget if config.grpo_execution == "async" else None,
                retries=config.server_check_retries,
            )
        else:
            limit = server_max_model_len(url, retries=config.server_check_retries)
        return limit, f"the vLLM server's max_model_len at {url}"
    model_config = read_model_config(config.model)
    limit = model_config.get("max_position_embeddings")
    where = f"the model's max_position_embeddings ({config.model})"
    if check and limit is not None:
        check_fits(config.max_completion_length, limit, limit_name=where, max_tokens_name="max_completion_length")
    return limit, where
