"""The checkpoint evaluation's staging: each saved checkpoint is snapshotted at once into
`_eval_staging/checkpoint-N` with hard links (rufus_eval/staging.py), so `save_total_limit`
rotation cannot delete what is being evaluated, and removed once its evaluation has finished
(`keep_staging` keeps it), its disk use reported and written to `eval_logs/staging.jsonl`.

A sharded checkpoint (FSDP SHARDED_STATE_DICT, ZeRO-3 partitions) is staged with its shards and
the live model's config and tokenizer; the evaluation's process consolidates it before its server
starts. A LoRA checkpoint holds only the adapter: the evaluation merges it into the base in the
staging copy (`rufus_eval.runner.local_model`)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from rufus_data.base.console import console
from rufus_data.folders.run_folder import STAGING, STAGING_LOG, checkpoint_dir
from rufus_eval.staging import sharded_kind, stage_checkpoint, staging_usage, write_model_files


class StagedCheckpoints:
    """The staged copies of one run's checkpoints, and what each used."""

    def __init__(self, keep: bool = False):
        self.keep = keep
        self.usage: list[dict] = []  # per staged checkpoint: step, bytes, only_here_bytes, removed
        self._reported = 0

    def stage(self, output_dir: str | Path, step: int, model=None, processing_class=None,
              base_model: str | None = None) -> Path:
        """Snapshot checkpoint-`step` of `output_dir`; the staged folder."""
        source = checkpoint_dir(output_dir, step)
        staged = checkpoint_dir(Path(output_dir) / STAGING, step)
        stage_checkpoint(source, staged)
        if sharded_kind(staged) and model is not None:
            write_model_files(staged, model, processing_class, base_model)
        return staged

    def release(self, step: int, staged: Path, logs: Path) -> None:
        """Measure what the staged folder used; remove it unless `keep` (its evaluation is over)."""
        if not staged.exists():
            return
        usage = {"step": step, **staging_usage(staged), "removed": not self.keep}
        if usage["removed"]:
            shutil.rmtree(staged, ignore_errors=True)
        self.usage.append(usage)
        with open(logs / STAGING_LOG, "a") as fh:
            fh.write(json.dumps(usage) + "\n")
        console.print(
            f"eval: staging of checkpoint-{step} used {usage['bytes'] / 1e6:.1f} MB, "
            f"{usage['only_here_bytes'] / 1e6:.1f} MB of it held by staging alone; "
            + ("removed" if usage["removed"] else f"kept in {staged} (keep_staging)")
        )

    def report(self) -> None:
        """The most staging held at once, and what is left; once per newly staged checkpoint."""
        if len(self.usage) == self._reported:
            return
        self._reported = len(self.usage)
        peak = max(u["only_here_bytes"] for u in self.usage)
        left = sum(u["bytes"] for u in self.usage if not u["removed"])
        console.print(f"eval: staging held at most {peak / 1e6:.1f} MB of its own at a time (one evaluation at a "
                      f"time); {left / 1e6:.1f} MB left in {STAGING}/")
