"""The `eval` block of a stage config: the evaluation request's settings (rufus_eval/request.py),
and when to evaluate. Its GPUs are the stage's `devices.eval` role (rufus_data/devices.py)."""

from __future__ import annotations

from rufus_eval.request import EvalSettings, FolderBackend


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
