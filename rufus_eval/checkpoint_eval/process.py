"""The checkpoint evaluation's process supervision: one evaluation at a time, `rufus-eval suite`
in a child process in its own session (it starts the vLLM server for the vllm backend, or runs
transformers for hf), reading its whole request from the job.json written beside its log.

The child is stopped with `os.killpg` (SIGTERM, then SIGKILL) on the normal path, on exceptions,
in `on_train_end` and from an `atexit` hook (the callback's), and by Linux when the trainer dies
(PR_SET_PDEATHSIG: a killed job leaves no evaluation behind). It inherits none of the trainer's
distributed variables, and its GPUs are the evaluation role's, verbatim."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from rufus_data.base.paths import atomic_file
from rufus_data.folders.run_folder import EVAL_JOB, EVAL_LOG
from rufus_data.generate.launcher import die_with_parent
from rufus_eval.staging import sharded_kind

# the trainer's launcher (torchrun, accelerate) describes ITS process group in these; an evaluation
# that inherited them would try to join the training's rendezvous and hang
DISTRIBUTED_ENV = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
                   "ROLE_RANK", "ROLE_NAME", "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
DISTRIBUTED_ENV_PREFIXES = ("TORCHELASTIC_", "ACCELERATE_", "TORCH_NCCL_", "NCCL_ASYNC")


def evaluation_command(job_file: Path, model: Path, gpus: str | None) -> tuple[list[str], dict[str, str]]:
    """argv and environment of the evaluation whose request is in `job_file`, of the model folder
    `model`, on the physical GPUs `gpus` (whatever the trainer's own CUDA_VISIBLE_DEVICES says)."""
    argv = [sys.executable, "-m", "rufus_eval.cli", "suite", "--request", str(job_file)]
    if sharded_kind(Path(model)):  # consolidated in the evaluation's process, before the server starts
        argv = [sys.executable, "-m", "rufus_eval.staging", str(model), "--", *argv]
    env = {k: v for k, v in os.environ.items()
           if k not in DISTRIBUTED_ENV and not k.startswith(DISTRIBUTED_ENV_PREFIXES)}
    if gpus is not None:
        env["CUDA_VISIBLE_DEVICES"] = gpus
    return argv, env


def write_job(out: Path, job: dict) -> None:
    with atomic_file(out / EVAL_JOB) as tmp:  # the evaluation may be reading it
        tmp.write_text(json.dumps(job, indent=2))


def keep_beside_results(log, job: dict, out: Path) -> None:
    """rufus-eval writes its run folder atomically, replacing `out` with what it wrote: put the
    evaluation's log and job.json (written there before it started) back beside its results."""
    try:
        if not (out / EVAL_LOG).exists():
            log.seek(0)
            (out / EVAL_LOG).write_bytes(log.read())
        if not (out / EVAL_JOB).exists() and out.exists():
            write_job(out, job)
    finally:
        log.close()


class EvaluationProcess:
    """Runs one evaluation at a time and tells when it ended."""

    def __init__(self):
        self.jobs: list[dict] = []
        self._proc: subprocess.Popen | None = None
        self._watcher: threading.Thread | None = None
        self._lock = threading.Lock()

    def busy(self) -> bool:
        with self._lock:
            return self._proc is not None

    def start(self, argv: list[str], env: dict[str, str], out: Path, job: dict,
              ended: Callable[[int | None], None]) -> int:
        """Start `argv` with its log in `out`; `job` (with the request) goes to out/job.json first,
        then again with the process ids. `ended(exit code)` is called from the watching thread
        when the process has ended (None: waiting for it failed). Returns the process id."""
        out.mkdir(parents=True, exist_ok=True)
        job = {**job, "argv": argv}
        write_job(out, job)
        log = open(out / EVAL_LOG, "w+b")  # noqa: SIM115 - closed by the watcher thread
        with self._lock:
            self._proc = subprocess.Popen(
                argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                start_new_session=True, preexec_fn=die_with_parent(),  # noqa: PLW1509 - only prctl()
            )
            proc = self._proc
        job.update(pid=proc.pid, pgid=proc.pid)
        write_job(out, job)
        self.jobs.append(job)
        self._watcher = threading.Thread(target=self._watch, args=(proc, log, job, out, ended), daemon=True)
        self._watcher.start()
        return proc.pid

    def _watch(self, proc: subprocess.Popen, log, job: dict, out: Path, ended: Callable[[int | None], None]) -> None:
        code = None
        try:
            code = proc.wait()
        finally:
            keep_beside_results(log, job, out)
            try:
                ended(code)
            finally:
                with self._lock:
                    if self._proc is proc:
                        self._proc = None

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
