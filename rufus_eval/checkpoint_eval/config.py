"""The `eval` block of a stage config: the evaluation request's settings (rufus_eval/request.py),
and when to evaluate. Its GPUs are the stage's `devices.eval` role (rufus_data/devices.py)."""

from __future__ import annotations

from pydantic import model_validator

from rufus_data.generate.backend_config import FolderBackend
from rufus_eval.request import EvalSettings


class CheckpointEvalConfig(EvalSettings):
    """What each checkpoint's evaluation runs (the request's settings) and its schedule."""

    suite: str = "quick"
    backend: FolderBackend = "auto"  # a checkpoint is loaded (hf) or served by Rufus (vllm): no `server`
    eval_on_checkpoint: bool = False
    eval_baseline: bool = True  # evaluate the starting model as <tag>-checkpoint-0 before step 1
    tag: str = "model"  # served model name prefix: <tag>-checkpoint-N
    wait_at_end: bool = True  # the last checkpoint waits for a running evaluation (then it is stopped)
    end_timeout_s: float = 3600.0  # how long that wait may take
    keep_staging: bool = False  # keep _eval_staging/checkpoint-N after its evaluation (default: removed)

    @model_validator(mode="after")
    def _no_server(self) -> CheckpointEvalConfig:
        if self.base_urls:
            raise ValueError("eval.base_urls: a checkpoint is loaded (hf) or served by Rufus (vllm), never reached at "
                             "a server someone else runs; remove it")
        if self.devices is not None:
            raise ValueError(f"eval.devices: the evaluation's GPUs are the stage's GPU roles: write `devices: {{eval: "
                             f"\"{self.devices}\"}}` (or --devices.eval) instead")
        return self
