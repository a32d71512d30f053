"""The checkpoint evaluation's tracker logging: each result into the W&B and trackio runs that
transformers' own callbacks started, on the `eval/step` axis."""

from __future__ import annotations

import warnings

from rufus_data.base.console import console

TRACKERS = ("wandb", "trackio")


class Trackers:
    """The trackers of the training's `report_to` that results are logged into."""

    def __init__(self):
        self.names: list[str] = []
        self._wandb_axis_run: str | None = None  # the W&B run whose eval/step axis is declared

    def setup(self, args) -> None:
        report_to = args.report_to if isinstance(args.report_to, list) else [args.report_to]
        self.names = [t for t in TRACKERS if t in (report_to or [])]
        if not self.names:
            message = (
                "checkpoint evaluation: no tracker in report_to (wandb or trackio); eval/<task> results go to the "
                "training log and eval_logs/metrics.jsonl only"
            )
            console.print(f"[yellow]WARNING:[/] {message}")
            warnings.warn(message, stacklevel=3)

    def log(self, entry: dict) -> None:
        """Log into the runs that transformers' WandbCallback / TrackioCallback started. The W&B
        axis is declared at the first result, when the run surely exists (whatever the callback
        order); a run that has already ended is told about in a warning, never a crash."""
        if "wandb" in self.names:
            import wandb  # optional: only for a run that reports to W&B

            if wandb.run is None:
                self._warn_unlogged("wandb", entry)
            else:
                if self._wandb_axis_run != wandb.run.id:
                    wandb.define_metric("eval/step")
                    wandb.define_metric("eval/*", step_metric="eval/step")
                    self._wandb_axis_run = wandb.run.id
                wandb.log(entry)
        if "trackio" in self.names:
            import trackio  # optional: only for a run that reports to trackio

            if trackio.context_vars.current_run.get() is None:
                self._warn_unlogged("trackio", entry)
            else:
                trackio.log(entry)  # trackio has no define_metric: eval/step is in every record

    @staticmethod
    def _warn_unlogged(tracker: str, entry: dict) -> None:
        message = (f"checkpoint evaluation: {tracker} has no active run, so the results of step {entry['eval/step']} "
                   "went to the training log and eval_logs/metrics.jsonl only")
        console.print(f"[yellow]WARNING:[/] {message}")
        warnings.warn(message, stacklevel=4)
