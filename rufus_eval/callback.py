"""Evaluate checkpoints while training runs, on other devices, without ever blocking or breaking it.

`CheckpointEvalCallback` (a transformers TrainerCallback, attached by every rufus-train stage):
- rank 0 only (`state.is_world_process_zero`); other ranks return at once and no collective
  operation is issued;
- `on_train_begin` (with `eval_baseline`, on a fresh run): the starting model's own folder is
  evaluated as `<tag>-checkpoint-0`, logs in `<output_dir>/eval_logs/step-0/` (nothing is saved:
  under FSDP or ZeRO-3 rank 0 holds only shards). A resumed run has no baseline; its
  eval_logs/metrics.jsonl keeps the evaluations up to the resumed step (those after it are
  evaluated again as the run reaches them), and the resumed checkpoint's evaluation runs again
  when the stopped job had started it and never finished;
- `on_save`: the checkpoint is snapshotted at once into `_eval_staging/checkpoint-N` with hard
  links (staging.py), so `save_total_limit` rotation cannot delete what is being evaluated. A
  sharded checkpoint (FSDP SHARDED_STATE_DICT, ZeRO-3 partitions) is consolidated in the
  evaluation's process before the server starts. A LoRA checkpoint holds only the adapter: the
  evaluation merges it into the base in the staging copy (`rufus_eval.runner.prepare_model`).
  Once its evaluation has finished the staged folder is removed (`keep_staging` keeps it); the
  disk it used is reported and written to `eval_logs/staging.jsonl`;
- one evaluation at a time: a checkpoint arriving while one runs is skipped with a warning; the
  last checkpoint (training stopped) waits for the running evaluation instead (`wait_at_end`);
- the evaluation is `rufus-eval suite` in a child process in its own session (it starts the vLLM
  server for the vllm backend, or runs transformers for hf); it is stopped with `os.killpg` on
  the normal path, on exceptions, in `on_train_end` and from an `atexit` hook, and by Linux when
  the trainer dies (PR_SET_PDEATHSIG: a killed job leaves no evaluation behind);
- results become `eval/<task>` metrics on the `eval/step` axis (W&B `define_metric`; trackio
  gets `eval/step` in every record), with `train/global_step` = the step; they also go to the
  training log (`state.log_history`) and `<output_dir>/eval_logs/metrics.jsonl`. The last
  checkpoint's evaluation is awaited in its `on_save` (with `wait_at_end`): transformers calls the
  trackers' `on_train_end` before ours, and TrackioCallback closes its run there.
`eval_devices` are physical GPU ids given verbatim to the evaluation's CUDA_VISIBLE_DEVICES."""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path
from typing import Literal

from pydantic import Field
from transformers import TrainerCallback

from rufus_data.console import console
from rufus_data.errors import RufusError
from rufus_data.generate.launcher import die_with_parent
from rufus_data.paths import atomic_file
from rufus_data.run_folder import EVAL_LOGS, METRICS, STAGING, checkpoint_dir
from rufus_data.yaml_config import StrictModel
from rufus_eval.staging import sharded_kind, stage_checkpoint, staging_usage, write_model_files

STAGING_LOG = "staging.jsonl"
TRACKERS = ("wandb", "trackio")
# the trainer's launcher (torchrun, accelerate) describes ITS process group in these; an evaluation
# that inherited them would try to join the training's rendezvous and hang
DISTRIBUTED_ENV = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
                   "ROLE_RANK", "ROLE_NAME", "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
DISTRIBUTED_ENV_PREFIXES = ("TORCHELASTIC_", "ACCELERATE_", "TORCH_NCCL_", "NCCL_ASYNC")


class CheckpointEvalConfig(StrictModel):
    """The `eval` block of a stage config."""

    eval_on_checkpoint: bool = False
    eval_baseline: bool = True
    suite: str = "quick"
    tag: str = "model"  # served model name prefix: <tag>-checkpoint-N
    backend: Literal["auto", "vllm", "hf"] = "auto"  # auto: vllm with GPUs, hf (separate process) without
    eval_devices: str = "0,1"
    data_parallel_size: int | None = Field(None, ge=1)  # default: the number of eval_devices
    limit: int | None = Field(None, ge=1)
    samples: int | None = Field(None, ge=1)
    max_tokens: int | None = Field(None, ge=1)
    final: bool = False
    wait_at_end: bool = True  # on_train_end waits for a running evaluation (then stops it)
    end_timeout_s: float = 3600.0
    keep_staging: bool = False  # keep _eval_staging/checkpoint-N after its evaluation (default: removed)


def gpu_count() -> int:
    if shutil.which("nvidia-smi") is None:
        return 0
    with contextlib.suppress(Exception):
        import torch

        return torch.cuda.device_count()
    return 0


def trainer_devices(given: str | None = None) -> set[str]:
    """Physical GPU ids the trainer uses: `given` (the stage's trainer role, which the trainer
    process is started with), else its CUDA_VISIBLE_DEVICES, else every GPU."""
    visible = given or os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return {d.strip() for d in visible.split(",") if d.strip()}
    return {str(i) for i in range(gpu_count())}


def _keep_beside_results(log, job: dict, out: Path) -> None:
    """rufus-eval writes its run folder atomically, replacing `out` with what it wrote: put the
    evaluation's log and job.json (written there before it started) back beside its results."""
    try:
        if not (out / "eval.log").exists():
            log.seek(0)
            (out / "eval.log").write_bytes(log.read())
        if not (out / "job.json").exists() and out.exists():
            (out / "job.json").write_text(json.dumps(job, indent=2))
    finally:
        log.close()


def model_source(model) -> str | None:
    """The folder or hub id a model was loaded from (a PEFT model's base), None when unknown."""
    if model is None:
        return None
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    source = getattr(base, "name_or_path", None) or getattr(getattr(base, "config", None), "_name_or_path", None)
    return str(source) if source else None


class CheckpointEvalCallback(TrainerCallback):
    def __init__(self, config: CheckpointEvalConfig | dict | None = None, starting_model: str | None = None,
                 trainer_gpus: str | None = None):
        """`starting_model`: the model folder (or hub id) training starts from, evaluated as the
        step-0 baseline; default: the trained model's `name_or_path`. `trainer_gpus`: the
        trainer's physical GPU ids when the stage sets them (default: this process's)."""
        self.config = config if isinstance(config, CheckpointEvalConfig) else CheckpointEvalConfig(**(config or {}))
        self.starting_model = starting_model
        self.trainer_gpus = trainer_gpus
        self.devices = self._check_devices()
        self.staging: list[dict] = []  # per staged checkpoint: step, bytes, only_here_bytes, removed
        self._staging_reported = 0
        self._proc: subprocess.Popen | None = None
        self._watcher: threading.Thread | None = None
        self._results: queue.Queue = queue.Queue()
        self._lock = threading.Lock()
        self.skipped: list[int] = []
        self.logged: list[dict] = []
        self.jobs: list[dict] = []
        self._trackers: list[str] = []
        self._wandb_axis_run: str | None = None  # the W&B run whose eval/step axis is declared
        self._metrics_file: Path | None = None
        atexit.register(self.shutdown)

    # ------------------------------------------------------------------ start-up checks
    def _check_devices(self) -> str:
        cfg = self.config
        if not cfg.eval_on_checkpoint:
            return cfg.eval_devices
        devices = [d.strip() for d in cfg.eval_devices.split(",") if d.strip()]
        if not devices:
            raise RufusError(
                "eval_on_checkpoint is on but eval_devices is empty: give the physical GPU ids the evaluation "
                "server may use (e.g. eval_devices: \"0,1\"), or turn eval_on_checkpoint off"
            )
        trainer = trainer_devices(self.trainer_gpus)
        overlap = sorted(set(devices) & trainer)
        if overlap:
            message = (
                f"eval_devices {cfg.eval_devices} overlap the trainer's GPUs {sorted(trainer)} "
                f"(shared: {overlap}): evaluation and training will compete for memory and time"
            )
            console.print(f"[bold red]WARNING:[/] {message}")
            warnings.warn(message, stacklevel=3)
        return cfg.eval_devices

    def backend(self) -> str:
        if self.config.backend != "auto":
            return self.config.backend
        return "vllm" if gpu_count() > 0 else "hf"

    # ------------------------------------------------------------------ trainer events
    def on_train_begin(self, args, state, control, model=None, processing_class=None, **kwargs):
        if not self.config.eval_on_checkpoint or not state.is_world_process_zero:
            return
        self._setup_trackers(args)
        self._metrics_file = Path(args.output_dir) / EVAL_LOGS / METRICS
        self._metrics_file.parent.mkdir(parents=True, exist_ok=True)
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

    def _stage_and_start(self, args, step: int, model=None, processing_class=None) -> None:
        source = checkpoint_dir(args.output_dir, step)
        staged = checkpoint_dir(Path(args.output_dir) / STAGING, step)
        stage_checkpoint(source, staged)
        if sharded_kind(staged) and model is not None:
            write_model_files(staged, model, processing_class, self.starting_model)
        self._start(args, step, staged, staged=staged)

    def _resume(self, args, step: int, model=None, processing_class=None) -> None:
        """A resumed run (after a kill, perhaps) has no baseline (its weights are not the starting
        model). Its eval/step record keeps the evaluations up to the resumed step and drops those
        after it (the run reaches and evaluates those steps again); an evaluation the killed job
        finished but never logged is logged now; the resumed checkpoint's own evaluation, started
        by the killed job and never finished, runs again."""
        logged = self._keep_metrics_up_to(step)
        logs = Path(args.output_dir) / EVAL_LOGS
        for folder in sorted(logs.glob("step-*")):
            done = folder.name.removeprefix("step-")
            if done.isdigit() and int(done) <= step and int(done) not in logged and (folder / "results.json").exists():
                self._results.put((int(done), json.loads((folder / "results.json").read_text())))
        console.print(f"eval: resumed at step {step}: eval/step keeps the evaluations up to step {step}; no baseline "
                      "(the resumed weights are not the starting model)")
        lost = (logs / f"step-{step}" / "job.json").exists() and not (logs / f"step-{step}" / "results.json").exists()
        if lost and checkpoint_dir(args.output_dir, step).is_dir():
            console.print(f"eval: the evaluation of checkpoint-{step} did not finish before the run stopped: again")
            self._stage_and_start(args, step, model, processing_class)

    def _keep_metrics_up_to(self, step: int) -> set[int]:
        """Drop the eval_logs/metrics.jsonl lines of steps after `step`; the steps of the lines kept."""
        if self._metrics_file is None or not self._metrics_file.exists():
            return set()
        entries = [json.loads(line) for line in self._metrics_file.read_text().splitlines() if line.strip()]
        kept = [entry for entry in entries if entry.get("eval/step", 0) <= step]
        if len(kept) < len(entries):
            with atomic_file(self._metrics_file) as tmp:
                tmp.write_text("".join(json.dumps(entry) + "\n" for entry in kept))
        return {entry["eval/step"] for entry in kept if "eval/step" in entry}

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
        self._report_staging()

    def _report_staging(self) -> None:
        if len(self.staging) == self._staging_reported:  # once per new staged checkpoint (on_save, then on_train_end)
            return
        self._staging_reported = len(self.staging)
        peak = max(u["only_here_bytes"] for u in self.staging)
        left = sum(u["bytes"] for u in self.staging if not u["removed"])
        console.print(f"eval: staging held at most {peak / 1e6:.1f} MB of its own at a time (one evaluation at a "
                      f"time); {left / 1e6:.1f} MB left in {STAGING}/")

    # ------------------------------------------------------------------ the evaluation process
    def busy(self) -> bool:
        with self._lock:
            return self._proc is not None

    def eval_command(self, output_dir: str | Path, step: int, staged: Path) -> tuple[list[str], dict[str, str]]:
        """argv and environment of the evaluation of one staged checkpoint."""
        cfg = self.config
        out = Path(output_dir) / EVAL_LOGS / f"step-{step}"
        backend = self.backend()
        argv = [
            sys.executable, "-m", "rufus_eval.cli", "suite", cfg.suite, "--ckpt", str(staged),
            "--backend", backend, "--out", str(out), "--step", str(step), "--name", f"{cfg.tag}-checkpoint-{step}",
            "--db", str(Path(output_dir) / EVAL_LOGS / "results.duckdb"),
        ]
        for flag, value in (("--limit", cfg.limit), ("--samples", cfg.samples), ("--max-tokens", cfg.max_tokens)):
            if value is not None:
                argv += [flag, str(value)]
        if cfg.final:
            argv.append("--final")
        if backend == "vllm" and gpu_count() > 0:  # without GPUs the launcher picks vLLM's CPU build
            dp = cfg.data_parallel_size or len(self.devices.split(","))
            argv += ["--devices", self.devices, "--data-parallel-size", str(dp)]
        if sharded_kind(Path(staged)):  # consolidated in the evaluation's process, before the server starts
            argv = [sys.executable, "-m", "rufus_eval.staging", str(staged), "--", *argv]
        env = {k: v for k, v in os.environ.items()
               if k not in DISTRIBUTED_ENV and not k.startswith(DISTRIBUTED_ENV_PREFIXES)}
        # physical ids, verbatim, whatever the trainer's own CUDA_VISIBLE_DEVICES says
        env["CUDA_VISIBLE_DEVICES"] = self.devices
        return argv, env

    def _start(self, args, step: int, target: Path, staged: Path | None = None) -> None:
        """Evaluate the model folder `target` as step `step`; `staged` is removed once it is done."""
        argv, env = self.eval_command(args.output_dir, step, target)
        out = Path(args.output_dir) / EVAL_LOGS / f"step-{step}"
        out.mkdir(parents=True, exist_ok=True)
        name = f"{self.config.tag}-checkpoint-{step}"
        backend = self.backend()
        log = open(out / "eval.log", "w+b")  # noqa: SIM115 - closed by the watcher thread
        with self._lock:
            self._proc = subprocess.Popen(
                argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                start_new_session=True, preexec_fn=die_with_parent(),  # noqa: PLW1509 - only prctl()
            )
            proc = self._proc
        job = {"step": step, "name": name, "pid": proc.pid, "pgid": proc.pid, "argv": argv, "out": str(out),
               "model": str(target), "rank": int(os.environ.get("RANK", "0"))}
        self.jobs.append(job)
        (out / "job.json").write_text(json.dumps(job, indent=2))
        console.print(f"eval: evaluating {name} ({backend}) in process group {proc.pid}; log {out / 'eval.log'}")
        self._watcher = threading.Thread(target=self._watch, args=(proc, log, job, out, staged), daemon=True)
        self._watcher.start()

    def _watch(self, proc: subprocess.Popen, log, job: dict, out: Path, staged: Path | None = None) -> None:
        step = job["step"]
        try:
            code = proc.wait()
        finally:
            _keep_beside_results(log, job, out)
            if staged is not None:
                self._release_staging(step, staged, out.parent)
            with self._lock:
                if self._proc is proc:
                    self._proc = None
        if code == 0 and (out / "results.json").exists():
            self._results.put((step, json.loads((out / "results.json").read_text())))
        else:
            tail = (out / "eval.log").read_text(errors="replace")[-1500:]
            console.print(f"[red]eval:[/] evaluation of step {step} failed (exit {code}); log {out / 'eval.log'}:\n{tail}")

    def _release_staging(self, step: int, staged: Path, logs: Path) -> None:
        """Measure what the staged folder used; remove it unless `keep_staging` (its evaluation is over)."""
        if not staged.exists():
            return
        usage = {"step": step, **staging_usage(staged), "removed": not self.config.keep_staging}
        if usage["removed"]:
            shutil.rmtree(staged, ignore_errors=True)
        self.staging.append(usage)
        with open(logs / STAGING_LOG, "a") as fh:
            fh.write(json.dumps(usage) + "\n")
        console.print(
            f"eval: staging of checkpoint-{step} used {usage['bytes'] / 1e6:.1f} MB, "
            f"{usage['only_here_bytes'] / 1e6:.1f} MB of it held by staging alone; "
            + ("removed" if usage["removed"] else f"kept in {staged} (keep_staging)")
        )

    def wait(self, timeout_s: float | None = None) -> bool:
        """Wait for the running evaluation; True if none is left running."""
        watcher = self._watcher
        if watcher is not None:
            watcher.join(timeout_s)
        return not self.busy()

    def shutdown(self, grace_s: float = 10.0) -> None:
        """Stop a running evaluation: SIGTERM its process group, SIGKILL what is left."""
        with self._lock:
            proc = self._proc
        if proc is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=5)
        if self._watcher is not None:
            self._watcher.join(5)

    # ------------------------------------------------------------------ logging results
    def _setup_trackers(self, args) -> None:
        report_to = args.report_to if isinstance(args.report_to, list) else [args.report_to]
        self._trackers = [t for t in TRACKERS if t in (report_to or [])]
        if not self._trackers:
            message = (
                "checkpoint evaluation: no tracker in report_to (wandb or trackio); eval/<task> results go to the "
                "training log and eval_logs/metrics.jsonl only"
            )
            console.print(f"[yellow]WARNING:[/] {message}")
            warnings.warn(message, stacklevel=3)

    def drain(self, state) -> None:
        """Log finished evaluations (main thread only: trackers and log_history are not thread-safe)."""
        while True:
            try:
                step, record = self._results.get_nowait()
            except queue.Empty:
                return
            entry = {f"eval/{task}": t["value"] for task, t in record["tasks"].items() if t["value"] is not None}
            entry.update({"eval/step": step, "train/global_step": step})
            self.logged.append(entry)
            state.log_history.append({**entry, "step": state.global_step})
            self._log_to_trackers(entry)
            scores = ", ".join(f"{k}={v:.4f}" for k, v in entry.items() if k.startswith("eval/") and k != "eval/step")
            console.print(f"eval: step {step}: {scores}")
            if self._metrics_file is not None:
                with open(self._metrics_file, "a") as fh:
                    fh.write(json.dumps(entry) + "\n")

    def _log_to_trackers(self, entry: dict) -> None:
        """Log into the runs that transformers' WandbCallback / TrackioCallback started. The W&B
        axis is declared at the first result, when the run surely exists (whatever the callback
        order); a run that has already ended is told about in a warning, never a crash."""
        if "wandb" in self._trackers:
            import wandb

            if wandb.run is None:
                self._warn_unlogged("wandb", entry)
            else:
                if self._wandb_axis_run != wandb.run.id:
                    wandb.define_metric("eval/step")
                    wandb.define_metric("eval/*", step_metric="eval/step")
                    self._wandb_axis_run = wandb.run.id
                wandb.log(entry)
        if "trackio" in self._trackers:
            import trackio

            if trackio.context_vars.current_run.get() is None:
                self._warn_unlogged("trackio", entry)
            else:
                trackio.log(entry)  # trackio has no define_metric: eval/step is in every record

    @staticmethod
    def _warn_unlogged(tracker: str, entry: dict) -> None:
        message = (f"checkpoint evaluation: {tracker} has no active run, so the results of step {entry['eval/step']} "
                   "went to the training log and eval_logs/metrics.jsonl only")
        console.print(f"[yellow]WARNING:[/] {message}")
        warnings.warn(message, stacklevel=3)
