"""The `eval` block of a stage config: the evaluation request's settings (rufus_eval/request.py),
and when to evaluate. Its GPUs are the stage's `devices.eval` role (rufus_data/models/devices.py)."""

from __future__ import annotations

from pydantic import Field, model_validator

from rufus_data.generate.backend_config import FolderBackend
from rufus_eval.request import EvalSettings


class CheckpointEvalConfig(EvalSettings):
    """What each checkpoint's evaluation runs (the request's settings) and its schedule."""

    suite: str = Field("quick", description="suite name in catalogs/suites/ or a path to a suite YAML")
    backend: FolderBackend = Field(
        "auto", description="auto (vllm when a GPU and vLLM are here, else hf) | hf (in-process) | vllm (Rufus starts "
        "vLLM); a checkpoint is loaded or served by Rufus, so no server")
    eval_on_checkpoint: bool = Field(
        False, description="evaluate each saved checkpoint in another process while training runs")
    eval_baseline: bool = Field(
        True, description="a fresh run evaluates its starting model first, as step 0 (<tag>-checkpoint-0)")
    tag: str = Field("model", description="prefix of each evaluation's name and served model: <tag>-checkpoint-N")
    wait_at_end: bool = Field(
        True, description="the last checkpoint waits for a running evaluation instead of being skipped, and the "
        "run's end waits for the last evaluation (end_timeout_s), then stops it")
    end_timeout_s: float = Field(3600.0, description="seconds each wait at the end of training may take")
    keep_staging: bool = Field(
        False, description="keep _eval_staging/checkpoint-N after its evaluation (default: removed, its disk freed)")
    # settings of an evaluation request that a checkpoint's evaluation sets itself: refused, saying why
    base_urls: list[str] = Field(default_factory=list, description="not here: a checkpoint is loaded (hf) or served "
                                 "by Rufus (vllm), never reached at a server someone else runs")
    devices: str | None = Field(None, description="not here: the evaluation's GPUs are the stage's devices.eval")
    served_model_name: str | None = Field(None, description="not here: each checkpoint is served as "
                                          "<tag>-checkpoint-N (eval.tag)")
    tokenizer: str | None = Field(None, description="not here: a checkpoint folder holds its tokenizer")

    @model_validator(mode="after")
    def _settings_it_sets_itself(self) -> CheckpointEvalConfig:
        if self.devices is not None:
            raise ValueError(f"eval.devices: the evaluation's GPUs are the stage's GPU roles: write `devices: {{eval: "
                             f"\"{self.devices}\"}}` (or --devices.eval) instead")
        for key in ("base_urls", "served_model_name", "tokenizer"):
            if getattr(self, key):
                raise ValueError(f"eval.{key}: {type(self).model_fields[key].description}; remove it")
        return self
