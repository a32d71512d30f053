"""The `filter:` block of a GRPO stage (or of its entry in a pipeline), checked when the config
loads: what the stage's own prompt filter samples and keeps (grpo/prompt_filter.py runs it)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from rufus_data.base.errors import RufusError
from rufus_data.base.yaml_config import StrictModel

Bucket = Literal["learnable", "all_pass", "all_fail", "unscored", "constant", "outside_band"]
FILTERED_DIR = "filtered"  # beside the run folder: <output_dir's parent>/filtered/<stage>-<key>


class PromptFilter(StrictModel):
    """The `filter:` block of a GRPO stage (or of its entry in a pipeline)."""

    k: int = Field(8, ge=2, description="samples of the starting model per prompt")
    buckets: list[Bucket] = Field(["learnable"], min_length=1, description="the buckets trained on (learnable: some "
                                  "samples pass and some fail, the only ones with a GRPO gradient)")
    keep: str = Field("0<p<1", description="pass-rate band of learnable, e.g. '0.1<p<0.9' (rufus-data filter --keep)")
    max_tokens: int | None = Field(None, ge=1, description="tokens per sample; null: the stage's max_completion_length")
    temperature: float | None = Field(None, ge=0, description="sampling temperature; null: the stage's temperature")
    limit: int | None = Field(None, ge=1, description="filter a seeded sample of N prompts (null: all)")
    backend: Literal["auto", "hf", "vllm"] = Field("auto", description="how the filter generates: auto (vllm when a "
                                                   "GPU and vLLM are here, else hf), hf (in-process), vllm (a server)")
    folder: str | None = Field(None, description="where the filter outputs go, one folder per settings; null: "
                               "<output_dir's parent>/filtered")


def filter_settings(value: Any) -> Any:
    """`filter: true` is the defaults, `filter: false` none; a mapping is the block."""
    if value is True:
        return {}
    if value is False:
        return None
    return value


def check_prompt_filter(config) -> None:
    """What `filter:` would refuse after the data is mixed, said before anything loads."""
    from rufus_data.rollouts.filter import parse_band  # pyarrow: only for a stage that filters

    try:
        parse_band(config.filter.keep)
    except RufusError as err:
        raise RufusError(f"stage {config.stage} filter.keep: {err}") from None
    if config.reward_model:
        raise RufusError(f"stage {config.stage} sets `filter:` and `reward_model: {config.reward_model}`: the filter "
                         "scores with the rewards registry only, so it cannot tell what the reward model would call "
                         "learnable. Remove `filter:` (filter with a rule-based reward first), or the reward model")
    if config.max_rows is not None:
        raise RufusError(f"stage {config.stage} sets `filter:` and `max_rows: {config.max_rows}`: max_rows would sample "
                         "the filtered rows and throw learnable prompts away after generating for them. Use "
                         "`filter.limit` (prompts filtered), and drop max_rows")


