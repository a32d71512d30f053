"""`report_to: [wandb, trackio]` in a real rufus-train SFT run (tiny-random, LoRA, 2 steps, a
checkpoint at step 2, checkpoint evaluation with the hf backend), read back with the trackers' own
readers: W&B's transaction log through `wandb leet inspect --json` (wandb 0.31 reads .wandb files
in wandb-core; the Python DataStore of older releases is gone) and trackio's local SQLite store
through `trackio.sqlite_storage.SQLiteStorage`. No mocks, no network: W&B runs offline and both
keep their files under tmp_path.

The run happens in a child process (this file run as a script) because trackio fixes its storage
folder at import time and W&B keeps a service process per Python process: a fresh process gets
both from the test's environment, and W&B closes its run the way a `rufus-train` run does, at exit."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import warnings
from pathlib import Path
from types import SimpleNamespace

import pytest
from eval_callback_run import tiny_suite

from rufus_eval.checkpoint_eval.callback import CheckpointEvalCallback

REPO = Path(__file__).resolve().parents[1]
PROJECT = "rufus-trackers"
RUN_NAME = "sft-trackers"
CHECKPOINT_STEP = 2


def tracker_env(root: Path) -> dict[str, str]:
    """The environment of the child run: W&B offline and trackio local, every file under `root`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WANDB_", "TRACKIO_"))}
    env.update(
        WANDB_MODE="offline", WANDB_SILENT="true", WANDB_PROJECT=PROJECT, WANDB_DIR=str(root / "wandb"),
        WANDB_CACHE_DIR=str(root / "wandb-cache"), WANDB_CONFIG_DIR=str(root / "wandb-config"),
        WANDB_DATA_DIR=str(root / "wandb-data"), WANDB_ARTIFACT_DIR=str(root / "wandb-artifacts"),
        TRACKIO_DIR=str(root / "trackio"), HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1",
        PYTHONPATH=str(REPO / "tests"),
    )
    (root / "wandb").mkdir(parents=True, exist_ok=True)
    return env


def wandb_records(wandb_dir: Path) -> list[dict]:
    """Every record of the run's .wandb transaction log, decoded by wandb itself."""
    logs = list(wandb_dir.glob("wandb/offline-run-*/run-*.wandb"))
    assert len(logs) == 1, f"expected one offline W&B run under {wandb_dir}, found {logs}"
    wandb_cli = Path(sys.executable).with_name("wandb")
    proc = subprocess.run([str(wandb_cli), "leet", "inspect", str(logs[0]), "--json"], check=True,
                          capture_output=True, text=True, timeout=120)
    return [json.loads(line) for line in proc.stdout.splitlines() if line.strip()]


def wandb_service_processes(marker: str) -> list[int]:
    """pids of wandb-core processes started with `marker` in their environment (this test's)."""
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if b"wandb-core" in (proc / "cmdline").read_bytes() and marker.encode() in (proc / "environ").read_bytes():
                pids.append(int(proc.name))
        except OSError:  # gone meanwhile, or not ours
            continue
    return pids


@pytest.mark.spawn
def test_wandb_and_trackio_record_training_loss_and_checkpoint_evals_on_the_eval_step_axis(
        tmp_path, tiny_model, data_root):
    import example_shards

    spec = {
        "model": tiny_model,
        "data": str(example_shards.gsm8k_sft(data_root, tmp_path / "shards", limit=4, max_chars=350)),
        "out": str(tmp_path / "run"),
        "eval": {"eval_on_checkpoint": True, "suite": str(tiny_suite(tmp_path / "suite")), "tag": "tiny",
                 "backend": "hf", "limit": 1, "repeats": 1, "max_tokens": 4},
    }
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    env = tracker_env(tmp_path / "trackers")
    proc = subprocess.run([sys.executable, __file__, str(tmp_path / "spec.json")], check=False, capture_output=True,
                          text=True, timeout=600, cwd=REPO, env=env)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]

    # what the evaluations scored (rufus-eval's results.json), step 0 = the baseline
    out = Path(spec["out"])
    scores = {step: json.loads((out / "eval_logs" / f"step-{step}" / "results.json").read_text())["tasks"]["nocomma"]["value"]
              for step in (0, CHECKPOINT_STEP)}

    # W&B: the eval/* metrics are declared on the eval/step axis, and the history holds both kinds of rows
    records = wandb_records(tmp_path / "trackers" / "wandb")
    metrics = [r["metric"] for r in records if r["type"] == "metric"]
    assert {"glob_name": "eval/*", "step_metric": "eval/step"}.items() <= next(
        m for m in metrics if m.get("glob_name") == "eval/*").items(), metrics
    assert any(m.get("name") == "eval/step" for m in metrics)
    history = [r["history"]["item"] for r in records if r["type"] == "history"]
    evals = [h for h in history if "eval/nocomma" in h]
    assert [(h["eval/step"], h["train/global_step"]) for h in evals] == [(0, 0), (CHECKPOINT_STEP, CHECKPOINT_STEP)]
    assert [h["eval/nocomma"] for h in evals] == [scores[0], scores[CHECKPOINT_STEP]]
    losses = [h for h in history if "train/loss" in h]
    assert [h["train/global_step"] for h in losses] == [1, 2] and all(h["train/loss"] > 0 for h in losses)
    assert [r["exit"].get("exit_code", 0) for r in records if r["type"] == "exit"] == [0]  # the run was closed

    # trackio: the same rows in its local store (read back by the child, see main)
    logs = json.loads((out / "trackio_logs.json").read_text())
    evals = [row for row in logs if "eval/nocomma" in row]
    assert [(row["eval/step"], row["train/global_step"]) for row in evals] == [(0, 0), (CHECKPOINT_STEP, CHECKPOINT_STEP)]
    assert [row["eval/nocomma"] for row in evals] == [scores[0], scores[CHECKPOINT_STEP]]
    losses = [row for row in logs if "train/loss" in row]
    assert [row["train/global_step"] for row in losses] == [1, 2] and all(row["train/loss"] > 0 for row in losses)

    # W&B's service process ended with the run (it exits after its client process: allow it a moment)
    deadline = time.monotonic() + 10
    while wandb_service_processes(str(tmp_path)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert wandb_service_processes(str(tmp_path)) == []


def test_a_result_after_the_tracker_runs_ended_is_warned_about_not_fatal():
    """An evaluation that finishes once the trackers' runs are closed (or never started) must not
    crash the end of training: the result stays in the training log, with a warning per tracker."""
    evaluator = CheckpointEvalCallback({"eval_on_checkpoint": True, "backend": "hf"})
    evaluator.trackers.setup(SimpleNamespace(report_to=["wandb", "trackio"]))
    evaluator.curve.finished.put((4, {"tasks": {"nocomma": {"value": 0.5}}}))
    state = SimpleNamespace(global_step=4, log_history=[])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        evaluator.drain(state)
    assert [str(w.message).split(" has no active run")[0] for w in caught] == [
        "checkpoint evaluation: wandb", "checkpoint evaluation: trackio"]
    assert state.log_history == [{"eval/nocomma": 0.5, "eval/step": 4, "train/global_step": 4, "step": 4}]


# ---------------------------------------------------------------- the child process


def main(spec_path: str) -> None:
    """Run the SFT stage through rufus_train.runner.run_stage with both trackers, then read
    trackio's store back (after the run is finished) into OUT/trackio_logs.json."""
    from train_helpers import WaitForBaseline, tiny_config

    from rufus_eval.checkpoint_eval.callback import CheckpointEvalCallback
    from rufus_train.runner import run_stage
    from rufus_train.stages import get_stage

    stage = get_stage("sft")
    prepare = stage.prepare

    def prepare_and_wait(ctx):
        prepare(ctx)
        evaluator = next(c for c in ctx.callbacks if isinstance(c, CheckpointEvalCallback))
        ctx.callbacks.append(WaitForBaseline(evaluator))

    stage.prepare = prepare_and_wait
    spec = json.loads(Path(spec_path).read_text())
    out = Path(spec["out"])
    config = tiny_config("sft", Path(spec["data"]), out, model=spec["model"], max_steps=CHECKPOINT_STEP,
                         save_steps=CHECKPOINT_STEP,
                         report_to=["wandb", "trackio"], eval=spec["eval"],
                         trainer={"project": PROJECT, "run_name": RUN_NAME})
    run_stage(config)

    from trackio.sqlite_storage import SQLiteStorage

    (out / "trackio_logs.json").write_text(json.dumps(SQLiteStorage.get_logs(PROJECT, RUN_NAME), default=str))


if __name__ == "__main__":
    main(sys.argv[1])
