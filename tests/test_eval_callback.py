"""The checkpoint-eval callback in short CPU SFT runs (TRL SFTTrainer, LoRA r=4, built-in model),
evaluating with the hf backend in a separate process: step-0 baseline, hard-link staging that
survives save_total_limit rotation, skip-while-busy, metrics on the eval/step axis, no process
left after an exception, eval_devices errors and warnings, and rank 0 alone acting under 2 ranks."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
from eval_callback_run import build_trainer, tiny_suite
from train_helpers import WaitForBaseline
from transformers import TrainerCallback

from rufus_data.errors import RufusError
from rufus_data.generate.launcher import group_members
from rufus_eval.callback import STAGING, CheckpointEvalCallback, stage_checkpoint

REPO = Path(__file__).resolve().parents[1]


def eval_config(suite: Path, **overrides) -> dict:
    return {"eval_on_checkpoint": True, "suite": str(suite), "tag": "tiny", "backend": "hf", "limit": 1,
            "samples": 1, "max_tokens": 4, **overrides}


class RecordInodes(TrainerCallback):
    """At each save (after the eval callback staged it): is the staged weight file the same inode?"""

    def __init__(self):
        self.same_inode = {}

    def on_save(self, args, state, control, **kwargs):
        source = Path(args.output_dir) / f"checkpoint-{state.global_step}" / "adapter_model.safetensors"
        staged = Path(args.output_dir) / STAGING / f"checkpoint-{state.global_step}" / "adapter_model.safetensors"
        if staged.exists():
            self.same_inode[state.global_step] = os.stat(source).st_ino == os.stat(staged).st_ino


class RecordBusyAtSave(TrainerCallback):
    """Placed just before the evaluator: was an evaluation running when each checkpoint arrived?"""

    def __init__(self, evaluator: CheckpointEvalCallback):
        self.evaluator = evaluator
        self.busy_at_save = {}

    def on_save(self, args, state, control, **kwargs):
        self.busy_at_save[state.global_step] = self.evaluator.busy()


def test_sft_run_baseline_staging_rotation_busy_skip_and_eval_axis(tmp_path, builtin_model, data_root):
    suite = tiny_suite(tmp_path / "suite")
    out = tmp_path / "run"
    inodes = RecordInodes()
    trainer, evaluator = build_trainer(builtin_model, out, eval_config(suite), max_steps=3, save_total_limit=1)
    trainer.add_callback(WaitForBaseline(evaluator))
    trainer.add_callback(inodes)
    arrivals = RecordBusyAtSave(evaluator)
    handler = trainer.callback_handler.callbacks
    handler.insert(handler.index(evaluator), arrivals)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.train()
    messages = [str(w.message) for w in caught]

    # step-0 baseline, served and recorded as <tag>-checkpoint-0
    baseline = json.loads((out / "eval_logs" / "step-0" / "results.json").read_text())
    assert baseline["run"] == "tiny-checkpoint-0" and baseline["step"] == 0
    # checkpoint-1: hard-linked into staging, rotated away by save_total_limit=1, evaluated anyway
    assert inodes.same_inode[1] is True
    assert not (out / "checkpoint-1").exists()
    staged = out / STAGING / "checkpoint-1"
    assert (staged / "adapter_model.safetensors").exists() and (staged / "tokenizer_config.json").exists()
    assert not (staged / "optimizer.pt").exists() and not any(staged.glob("rng_state*"))
    assert (staged / "merged" / "config.json").exists()  # the LoRA adapter merged into the staging copy
    step1 = json.loads((out / "eval_logs" / "step-1" / "results.json").read_text())
    assert step1["run"] == "tiny-checkpoint-1" and step1["step"] == 1
    # one evaluation at a time: a checkpoint that arrives while one runs is skipped, not queued.
    # Which ones arrive while checkpoint-1 is evaluated depends on the machine's speed (the
    # deterministic case is test_checkpoint_arriving_while_busy_is_skipped_not_queued).
    assert arrivals.busy_at_save[1] is False
    assert evaluator.skipped == [s for s in (2, 3) if arrivals.busy_at_save[s]]
    assert sum("still running; this checkpoint is skipped" in m for m in messages) == len(evaluator.skipped)
    for step in (2, 3):
        assert (out / "eval_logs" / f"step-{step}").exists() == (step not in evaluator.skipped)
    # results on the eval/step axis, in the training log (no tracker configured, which is warned about)
    assert any("no tracker in report_to" in m for m in messages)
    eval_entries = [e for e in trainer.state.log_history if "eval/step" in e]
    evaluated = [0, 1] + [s for s in (2, 3) if s not in evaluator.skipped]
    assert [(e["eval/step"], e["train/global_step"]) for e in eval_entries] == [(s, s) for s in evaluated]
    assert all("eval/nocomma" in e for e in eval_entries)
    lines = (out / "eval_logs" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["eval/step"] for line in lines] == evaluated
    # nothing left running
    assert all(group_members(job["pgid"]) == [] for job in evaluator.jobs)


def test_no_evaluation_process_left_after_an_exception(tmp_path, builtin_model, data_root):
    """Training dies at step 1 while the baseline evaluation runs: the evaluation's process
    group is stopped (atexit hook) and the run's exception still reaches the caller."""
    suite = tiny_suite(tmp_path / "suite")
    spec = {"model": builtin_model, "out": str(tmp_path / "run"), "raise_at": 1, "max_steps": 3,
            "eval": eval_config(suite, max_tokens=64, samples=4)}
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    proc = subprocess.run([sys.executable, str(REPO / "tests" / "eval_callback_run.py"), str(tmp_path / "spec.json")],
                          check=False, capture_output=True, text=True, timeout=600, cwd=REPO,
                          env=dict(os.environ, PYTHONPATH=str(REPO / "tests")))
    assert proc.returncode != 0 and "planned failure at step 1" in proc.stderr
    job = json.loads((tmp_path / "run" / "eval_logs" / "step-0" / "job.json").read_text())
    assert not (tmp_path / "run" / "eval_logs" / "step-0" / "results.json").exists()  # stopped mid-way
    assert group_members(job["pgid"]) == []


def test_rank_zero_alone_evaluates_under_two_gloo_ranks(tmp_path, builtin_model, data_root):
    suite = tiny_suite(tmp_path / "suite")
    spec = {"model": builtin_model, "out": str(tmp_path / "run"), "max_steps": 1,
            "eval": eval_config(suite, eval_baseline=False)}
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    proc = subprocess.run([*torchrun, str(REPO / "tests" / "eval_callback_run.py"), str(tmp_path / "spec.json")],
                          check=False, capture_output=True, text=True, timeout=900, cwd=REPO,
                          env=dict(os.environ, PYTHONPATH=str(REPO / "tests"), OMP_NUM_THREADS="1"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    ranks = {r: json.loads((tmp_path / "run" / f"rank{r}.json").read_text()) for r in (0, 1)}
    assert [j["step"] for j in ranks[0]["jobs"]] == [1] and ranks[1]["jobs"] == [] and ranks[1]["logged"] == []
    assert [e["eval/step"] for e in ranks[0]["logged"]] == [1]
    assert sorted(p.name for p in (tmp_path / "run" / "eval_logs").iterdir() if p.is_dir()) == ["step-1"]


def test_eval_devices_errors_and_warnings(monkeypatch, tmp_path):
    with pytest.raises(RufusError, match="eval_devices is empty"):
        CheckpointEvalCallback({"eval_on_checkpoint": True, "eval_devices": " "})
    CheckpointEvalCallback({"eval_on_checkpoint": False, "eval_devices": ""})  # switch off: no check
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,2")
    with pytest.warns(UserWarning, match=r"overlap the trainer's GPUs \['1', '2'\] \(shared: \['1'\]\)"):
        callback = CheckpointEvalCallback({"eval_on_checkpoint": True})  # default eval_devices "0,1"
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "x")
    argv, env = callback.eval_command(tmp_path, 7, tmp_path / "staged")
    assert env["CUDA_VISIBLE_DEVICES"] == "0,1"  # verbatim, not the trainer's "1,2"
    assert not {"RANK", "WORLD_SIZE", "TORCHELASTIC_RUN_ID"} & set(env)  # never joins the trainer's rendezvous
    assert argv[argv.index("--name") + 1] == "model-checkpoint-7"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        CheckpointEvalCallback({"eval_on_checkpoint": True, "eval_devices": "0,1"})  # no overlap: no warning


def test_staging_copies_across_file_systems_with_a_warning(tmp_path, monkeypatch):
    src = tmp_path / "checkpoint-5"
    src.mkdir()
    for name in ("model.safetensors", "config.json", "tokenizer.json", "optimizer.pt", "rng_state.pth"):
        (src / name).write_text(name)

    def no_links(*_):
        raise OSError(18, "Invalid cross-device link")

    monkeypatch.setattr(os, "link", no_links)
    with pytest.warns(UserWarning, match="hard links failed"):
        assert stage_checkpoint(src, tmp_path / "staged") == "copy"
    assert sorted(p.name for p in (tmp_path / "staged").iterdir()) == ["config.json", "model.safetensors", "tokenizer.json"]
    shutil.rmtree(src)
    assert (tmp_path / "staged" / "model.safetensors").read_text() == "model.safetensors"


def test_checkpoint_arriving_while_busy_is_skipped_not_queued(tmp_path, monkeypatch):
    """A checkpoint that arrives while an evaluation runs is skipped with a warning and never
    evaluated later; the running evaluation's process group is stopped at the end. The running
    evaluation is a real process that outlives the arrivals (a sleep), so the rule is tested
    without depending on how fast the machine trains or evaluates."""
    from types import SimpleNamespace

    evaluator = CheckpointEvalCallback({"eval_on_checkpoint": True, "eval_baseline": False, "backend": "hf"})
    monkeypatch.setattr(evaluator, "eval_command",
                        lambda output_dir, step, staged: ([sys.executable, "-c", "import time; time.sleep(60)"], dict(os.environ)))
    args = SimpleNamespace(output_dir=str(tmp_path))
    for step in (1, 2, 3):
        checkpoint = tmp_path / f"checkpoint-{step}"
        checkpoint.mkdir()
        (checkpoint / "adapter_model.safetensors").write_bytes(b"weights")
        state = SimpleNamespace(is_world_process_zero=True, global_step=step, log_history=[])
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            evaluator.on_save(args, state, None)
        skipped_now = any("still running; this checkpoint is skipped" in str(w.message) for w in caught)
        assert skipped_now == (step != 1)
    assert evaluator.skipped == [2, 3]
    assert [job["step"] for job in evaluator.jobs] == [1]  # skipped, not queued
    assert not (tmp_path / STAGING / "checkpoint-2").exists()
    pgid = evaluator.jobs[0]["pgid"]
    assert group_members(pgid) != []
    evaluator.shutdown(grace_s=2)
    assert group_members(pgid) == [] and not evaluator.busy()
