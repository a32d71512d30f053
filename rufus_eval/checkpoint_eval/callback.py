"""The checkpoint evaluation's trainer events: what happens at the start of training, at each
save and at the end; the other jobs are in this package's other modules."""

from __future__ import annotations

import atexit
import os
import warnings
from pathlib import Path

from transformers import TrainerCallback

from rufus_data.base.console import console
from rufus_data.folders.run_folder import EVAL_JOB, EVAL_LOG, RESULTS_JSON, checkpoint_dir, eval_step_dir
from rufus_data.models import devices as gpus
from rufus_data.models.devices import DeviceRoles
from rufus_eval.checkpoint_eval.config import CheckpointEvalConfig
from rufus_eval.checkpoint_eval.curve import EvalCurve
from rufus_eval.checkpoint_eval.process import EvaluationProcess, evaluation_command
from rufus_eval.checkpoint_eval.staged import StagedCheckpoints
from rufus_eval.checkpoint_eval.trackers import Trackers
from rufus_eval.request import EvalRequest


def model_source(model) -> str | None:
    """The folder or hub id a model was loaded from (a PEFT model's base), None when unknown."""
    if model is None:
        return None
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    source = getattr(base, "name_or_path", None) or getattr(getattr(base, "config", None), "_name_or_path", None)
    return str(source) if source else None


class CheckpointEvalCallback(TrainerCallback):
    def __init__(self, config: CheckpointEvalConfig | dict | None = None, starting_model: str | None = None,
                 devices: DeviceRoles | dict | None = None):
        """`starting_model`: the model folder (or hub id) training starts from, evaluated as the
        step-0 baseline; default: the trained model's `name_or_path`. `devices`: the stage's GPU
        roles (rufus_data/models/devices.py): the evaluation runs on `eval` (default 0,1), checked
        against the trainer's GPUs (`trainer`, default: this process's)."""
        self.config = config if isinstance(config, CheckpointEvalConfig) else CheckpointEvalConfig(**(config or {}))
        self.starting_model = starting_model
        self.devices = DeviceRoles.model_validate(devices or {})
        if self.config.eval_on_checkpoint:
            self.devices = self.devices.with_evaluation()
            # the evaluation's own pair; the server's pairs are the stage's to check (rufus_train/guards.py)
            self.devices.model_copy(update={"server": None}).check()
        self.staged = StagedCheckpoints(keep=self.config.keep_staging)
        self.process = EvaluationProcess()
        self.trackers = Trackers()
        self.curve = EvalCurve(self.trackers)
        self.skipped: list[int] = []
        atexit.register(self.shutdown)

    # what a caller reads: the evaluations started, their results logged, the staging they used
    @property
    def jobs(self) -> list[dict]:
        return self.process.jobs

    @property
    def logged(self) -> list[dict]:
        return self.curve.logged

    @property
    def staging(self) -> list[dict]:
        return self.staged.usage

    def busy(self) -> bool:
        return self.process.busy()

    def wait(self, timeout_s: float | None = None) -> bool:
        """Wait for the running evaluation; True if none is left running."""
        return self.process.wait(timeout_s)

    def shutdown(self, grace_s: float = 10.0) -> None:
        """Stop a running evaluation (its whole process group)."""
        self.process.shutdown(grace_s)

    def drain(self, state) -> None:
        """Log finished evaluations (the trainer's thread only)."""
        self.curve.drain(state)

    # ------------------------------------------------------------------ trainer events
    def on_train_begin(self, args, state, control, model=None, processing_class=None, **kwargs):
        if not self.config.eval_on_checkpoint or not state.is_world_process_zero:
            return
        self.trackers.setup(args)
        self.curve.open(args.output_dir)
        if state.global_step > 0:
            self._resume(args, state.global_step, model, processing_class)
            return
        if not self.config.eval_baseline:
            return
        source = self.starting_model or model_source(model)
        if source is None:
            message = ("checkpoint evaluation: the model has no folder or hub id to evaluate as the step-0 baseline "
                       "(pass starting_model); the baseline is skipped")
            console.print(f"[yellow]WARNING:[/] {message}")
            warnings.warn(message, stacklevel=2)
            return
        self._start(args, 0, Path(source))  # the starting model itself: no copy, no gather of shards

    def on_save(self, args, state, control, **kwargs):
        if not self.config.eval_on_checkpoint or not state.is_world_process_zero:
            return
        self.drain(state)
        step = state.global_step
        last = control is not None and control.should_training_stop
        if last and self.busy() and self.config.wait_at_end:
            # training is over: the final checkpoint waits for the running evaluation instead of being skipped
            console.print(f"eval: checkpoint-{step} is the last one: waiting for the running evaluation first")
            self.wait(self.config.end_timeout_s)
            self.drain(state)
        if self.busy():
            self.skipped.append(step)
            message = f"checkpoint-{step}: an evaluation is still running; this checkpoint is skipped (not queued)"
            console.print(f"[yellow]eval:[/] {message}")
            warnings.warn(message, stacklevel=2)
        else:
            self._stage_and_start(args, step, kwargs.get("model"), kwargs.get("processing_class"))
        if last:
            # the last checkpoint: finish here, because transformers runs the trackers' on_train_end
            # before ours, and TrackioCallback closes its run there
            self._finish(state)

    def on_step_end(self, args, state, control, **kwargs):
        if state.is_world_process_zero:
            self.drain(state)

    def on_log(self, args, state, control, **kwargs):
        if state.is_world_process_zero:
            self.drain(state)

    def on_train_end(self, args, state, control, **kwargs):
        if not self.config.eval_on_checkpoint or not state.is_world_process_zero:
            return
        self._finish(state)

    def _finish(self, state) -> None:
        """Wait for the running evaluation (`wait_at_end`), stop what is left, log the results."""
        if self.config.wait_at_end:
            self.wait(self.config.end_timeout_s)
        self.shutdown()
        self.drain(state)
        self.curve.report()
        self.staged.report()

    def _resume(self, args, step: int, model=None, processing_class=None) -> None:
        """A resumed run (after a kill, perhaps) has no baseline (its weights are not the starting
        model). Its eval/step curve keeps the evaluations up to the resumed step (curve.py); the
        resumed checkpoint's own evaluation, started by the killed job and never finished, runs again."""
        self.curve.resume(args.output_dir, step)
        console.print(f"eval: resumed at step {step}: eval/step keeps the evaluations up to step {step}; no baseline "
                      "(the resumed weights are not the starting model)")
        logs = eval_step_dir(args.output_dir, step)
        lost = (logs / EVAL_JOB).exists() and not (logs / RESULTS_JSON).exists()
        if lost and checkpoint_dir(args.output_dir, step).is_dir():
            console.print(f"eval: the evaluation of checkpoint-{step} did not finish before the run stopped: again")
            self._stage_and_start(args, step, model, processing_class)

    # ------------------------------------------------------------------ one evaluation
    def _stage_and_start(self, args, step: int, model=None, processing_class=None) -> None:
        staged = self.staged.stage(args.output_dir, step, model, processing_class, self.starting_model)
        self._start(args, step, staged, staged=staged)

    def request_for(self, output_dir: str | Path, step: int, model: Path) -> EvalRequest:
        """The evaluation request of the model folder `model` as step `step`: the config's
        settings, served as <tag>-checkpoint-N, on the evaluation's GPUs when there are GPUs
        (without, the vllm backend runs vLLM's CPU build)."""
        return self.config.request(
            checkpoint=str(model), out=eval_step_dir(output_dir, step), step=step, run_name=f"{self.config.tag}-checkpoint-{step}",
            overwrite=True,  # eval_logs/step-N holds the job.json and eval.log written before the suite starts
            devices=self.devices.eval if gpus.gpu_count() > 0 else None,
        )

    def eval_command(self, output_dir: str | Path, step: int, model: Path) -> tuple[list[str], dict[str, str]]:
        """argv and environment of the evaluation of one model folder (its request in job.json)."""
        job_file = eval_step_dir(output_dir, step) / EVAL_JOB
        return evaluation_command(job_file, model, self.devices.eval)

    def _start(self, args, step: int, target: Path, staged: Path | None = None) -> None:
        """Evaluate the model folder `target` as step `step`; `staged` is removed once it is done."""
        request = self.request_for(args.output_dir, step, target)
        out = Path(request.out)
        argv, env = self.eval_command(args.output_dir, step, target)
        job = {"step": step, "name": request.run_name, "out": str(out), "model": str(target),
               "rank": int(os.environ.get("RANK", "0")), "request": request.model_dump(mode="json")}

        def ended(code: int | None) -> None:
            if staged is not None:
                self.staged.release(step, staged, out.parent)
            self.curve.evaluation_ended(step, out, code)

        pid = self.process.start(argv, env, out, job, ended)
        console.print(f"eval: evaluating {request.run_name} ({request.backend}) in process group {pid}; "
                      f"log {out / EVAL_LOG}")
