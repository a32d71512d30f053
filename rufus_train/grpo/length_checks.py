"""What a GRPO run's prompts and completions must fit, checked before the model loads: the
completion length against the vLLM server's `max_model_len` (or the model's own
`max_position_embeddings` when the trainer generates), and, once the prompts are tokenized, the
longest prompt plus the completion length (vLLM would otherwise cut completions silently).

Async GRPO does not start without them: it waits for its server as long as TRL itself would
(`trainer.vllm_server_timeout`), then checks; a server that never answers stops the run, naming
the URL and the checks that could not run. (Sync server mode asks a few times and goes on with
the checks skipped, as before: its trainer fails at once on a server that is not there.)"""

from __future__ import annotations

import warnings

from rufus_data.base.catalog_files import docs_page
from rufus_data.base.console import console
from rufus_data.base.errors import RufusError
from rufus_data.generate.context import check_fits, server_max_model_len
from rufus_data.models.builtin import read_model_config
from rufus_data.models.openai_api import SERVER_KEY_VARIABLE, RetryPolicy, api_key, served_models, v1_url
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
    check_completion_fits(limit, base_url, max_completion_length, token_budget)
    return limit


def check_completion_fits(limit: int, base_url: str, max_completion_length: int, token_budget: int | None) -> None:
    """The server's max_model_len must leave room for a prompt beside max_completion_length; a set
    token_budget below it is warned about."""
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


# what async GRPO cannot check without its server's max_model_len
BEFORE_LOADING = ("max_completion_length against the server's max_model_len (before anything loads), and after "
                  "tokenization the longest prompt plus max_completion_length against it (with token_budget: null "
                  "also the token budget, which is max_model_len then)")
AFTER_TOKENIZATION = ("the longest prompt plus max_completion_length against the server's max_model_len (with "
                      "token_budget: null also the token budget, which is max_model_len then)")


def server_wait_s(config: GRPOStageConfig) -> float:
    """How long async GRPO waits for its server: TRL's own wait for it (trainer.vllm_server_timeout)."""
    from rufus_train.grpo.async_config import async_fields  # TRL: only when an async run is checked

    return float(config.trainer.get("vllm_server_timeout", async_fields()["vllm_server_timeout"].default))


def wait_for_max_model_len(base_url: str, wait_s: float, checks: str) -> int:
    """Async GRPO: GET /v1/models until the server answers, at most `wait_s` seconds, and its
    max_model_len; a RufusError naming the URL and the `checks` that could not run otherwise."""
    models_url = f"{v1_url(base_url)}/models"
    console.print(f"waiting up to {wait_s:g} s for the vLLM server at {base_url} (GET {models_url})", highlight=False)
    policy = RetryPolicy(attempts=None, backoff_s=1.0, max_backoff_s=5.0, total_s=wait_s)
    try:
        models = served_models(base_url, key=api_key(SERVER_KEY_VARIABLE), retry=policy)
    except RufusError as err:
        raise RufusError(
            f"grpo_execution: async: the vLLM server at {base_url} did not answer GET {models_url} within "
            f"{wait_s:g} s ({err}), so these checks could not run: {checks}. Async GRPO does not start without them "
            "(a prompt that does not fit fails minutes later, as an HTTP 400 the rollout worker retries). Start the "
            f"server first (`rufus-train serve --stage STAGE`, {docs_page('train_rl.md')}), point vllm_server at it, or wait "
            "longer with trainer.vllm_server_timeout"
        ) from None
    limit = models[0].get("max_model_len") if models else None
    if limit is None:
        raise RufusError(
            f"grpo_execution: async: the server at {base_url} answered GET {models_url} without a max_model_len (not a "
            f"vLLM server?), so these checks could not run: {checks}. Point vllm_server at the vLLM server "
            "`rufus-train serve` starts"
        )
    return int(limit)


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
    generates (async: waited for, or the run stops; sync: a few short retries, None = skipped), else the model's
    max_position_embeddings from its config.json. With check=True, also refuse a
    max_completion_length that leaves no room for any prompt."""
    url = config.server_url
    if url and config.grpo_execution == "async":
        limit = wait_for_max_model_len(url, server_wait_s(config), BEFORE_LOADING if check else AFTER_TOKENIZATION)
        if check:
            check_completion_fits(limit, url, config.max_completion_length, config.token_budget)
        return limit, f"the vLLM server's max_model_len at {url}"
    if url:
        if check:
            limit = check_completion_budget(url, config.max_completion_length, retries=config.server_check_retries)
        else:
            limit = server_max_model_len(url, retries=config.server_check_retries)
        return limit, f"the vLLM server's max_model_len at {url}"
    model_config = read_model_config(config.model)
    limit = model_config.get("max_position_embeddings")
    where = f"the model's max_position_embeddings ({config.model})"
    if check and limit is not None:
        check_fits(config.max_completion_length, limit, limit_name=where, max_tokens_name="max_completion_length")
    return limit, where
