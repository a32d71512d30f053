"""Pin a judged task's judge before anything is generated, so its number can be reproduced.

The suite's scorer, an `llm_judge` reward spec, names the judge (`model`, `base_url`; else
JUDGE_MODEL / JUDGE_BASE_URL, else http://localhost:8001/v1 and the first model the server lists). Before the
model under test produces a single answer, Rufus asks the judge server what it serves
(`GET /v1/models`) and which version it runs (`GET /version`, vLLM's route): an unreachable judge,
or one that does not serve the named model, is an error that says what to do, not a task whose
every sample quietly goes unscored. The resolved model id, endpoint and version go into the run's
`results.json` (`judges[task]`) and into the lm-eval config the metric reads, so every sample is
judged by exactly the model that was recorded."""

from __future__ import annotations

from rufus_data.base.errors import RufusError
from rufus_data.benchmarks.suite import ScorerSpec
from rufus_data.models.openai_api import served_models, server_version
from rufus_data.rewards.llm_judge import judge_connection


def pin_judge(scorer: ScorerSpec, where: str) -> tuple[ScorerSpec, dict]:
    """(the `llm_judge` scorer with the judge's endpoint and model id filled in, the record for results.json).

    `where` names the suite and task in error messages."""
    base_url, model, api_key = judge_connection(scorer.options.get("base_url"), scorer.options.get("model"))
    what_to_do = (
        f"start the judge server (e.g. `vllm serve {model or 'JUDGE_MODEL'} --port 8001`) or point the scorer's "
        f"base_url in {where} (or JUDGE_BASE_URL) at a running OpenAI-compatible server"
    )
    try:
        served = [entry["id"] for entry in served_models(base_url, key=api_key, timeout_s=10.0)]
    except RufusError as err:
        raise RufusError(f"{where}: the judge at {base_url} is not reachable ({err}); {what_to_do}") from None
    if not served:
        raise RufusError(f"{where}: the judge at {base_url} serves no model; {what_to_do}")
    if model is None:
        model = served[0]
    elif model not in served:
        raise RufusError(f"{where}: the judge at {base_url} serves {served}, not the scorer's model {model!r}: "
                         "set the scorer's model to the id it serves, or serve that model there")
    version = server_version(base_url, key=api_key, timeout_s=10.0)  # None: not vLLM, recorded as unknown
    pinned = scorer.with_options(base_url=base_url, model=model)
    reward = pinned.reward()
    record = {
        "model": model,
        "base_url": base_url,
        "server_version": version,
        "threshold": reward.threshold,
        "max_tokens": reward.max_tokens,
    }
    return pinned, record
