"""The checkpoint-eval callback in short CPU SFT runs (TRL SFTTrainer, LoRA r=4, tiny-random),
evaluating with the hf backend in a separate process: step-0 baseline, hard-link staging that
survives save_total_limit rotation, skip-while-busy, metrics on the eval/step axis, no process
left after an exception, devices.eval errors and warnings, the request handed to the evaluation
whole, and rank 0 alone acting under 2 ranks."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import warnings
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from eval_callback_run import build_trainer, tiny_suite
from train_helpers import WaitForBaseline
from transformers import TrainerCallback

from rufus_data.base.errors import RufusError
from rufus_data.folders.run_folder import STAGING, STAGING_LOG
from rufus_data.generate.launcher import group_members
from rufus_eval.checkpoint_eval.callback import CheckpointEvalCallback
from rufus_eval.staging import consolidate, sharded_kind, stage_checkpoint, write_model_files

REPO = Path(__file__).resolve().parents[1]


def eval_config(suite: Path, **overrides) -> dict:
    return {"eval_on_checkpoint": True, "suite": str(suite), "tag": "tiny", "backend": "hf", "limit": 1,
            "repeats": 1, "max_tokens": 4, **overrides}


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


@pytest.mark.spawn
def test_sft_run_baseline_staging_rotation_busy_skip_and_eval_axis(tmp_path, tiny_model, data_root):
    suite = tiny_suite(tmp_path / "suite")
    out = tmp_path / "run"
    inodes = RecordInodes()
    # keep_staging: the staged copies are inspected after the run (by default they go once evaluated)
    trainer, evaluator = build_trainer(tiny_model, out, eval_config(suite, keep_staging=True), max_steps=3,
                                       save_total_limit=1)
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
    assert evaluator.skipped == [s for s in (2,) if arrivals.busy_at_save[s]]
    assert 3 not in evaluator.skipped  # the last checkpoint waits for the running evaluation (wait_at_end)
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


@pytest.mark.spawn
def test_no_evaluation_process_left_after_an_exception(tmp_path, tiny_model, data_root):
    """Training dies at step 1 while the baseline evaluation runs: the evaluation's process
    group is stopped (atexit hook) and the run's exception still reaches the caller."""
    suite = tiny_suite(tmp_path / "suite")
    spec = {"model": tiny_model, "out": str(tmp_path / "run"), "raise_at": 1, "max_steps": 3,
            "eval": eval_config(suite, max_tokens=64, repeats=4)}
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    proc = subprocess.run([sys.executable, str(REPO / "tests" / "eval_callback_run.py"), str(tmp_path / "spec.json")],
                          check=False, capture_output=True, text=True, timeout=600, cwd=REPO,
                          env=dict(os.environ, PYTHONPATH=str(REPO / "tests")))
    assert proc.returncode != 0 and "planned failure at step 1" in proc.stderr
    job = json.loads((tmp_path / "run" / "eval_logs" / "step-0" / "job.json").read_text())
    assert not (tmp_path / "run" / "eval_logs" / "step-0" / "results.json").exists()  # stopped mid-way
    assert group_members(job["pgid"]) == []


KILLED_TRAINER = """
import json, sys, time
from types import SimpleNamespace
from rufus_eval.checkpoint_eval.callback import CheckpointEvalCallback
out = sys.argv[1]
evaluator = CheckpointEvalCallback({"eval_on_checkpoint": True, "backend": "hf"})
evaluator.eval_command = lambda output_dir, step, staged: ([sys.executable, "-c", "import time; time.sleep(120)"], {})
evaluator._start(SimpleNamespace(output_dir=out), 2, out)
print(json.dumps(evaluator.jobs[0]), flush=True)
time.sleep(120)
"""


@pytest.mark.spawn
def test_a_sigkilled_trainer_leaves_no_evaluation_running(tmp_path):
    """SIGKILL runs no atexit hook: Linux stops the evaluation with its parent (PR_SET_PDEATHSIG),
    so a killed job leaves neither an evaluation (nor its vLLM server) behind."""
    trainer = subprocess.Popen([sys.executable, "-c", KILLED_TRAINER, str(tmp_path)], stdout=subprocess.PIPE, text=True,
                               cwd=REPO)
    job = json.loads(trainer.stdout.readline())
    assert group_members(job["pgid"]) == [job["pid"]]  # the evaluation runs, in its own process group
    trainer.kill()
    trainer.wait(timeout=30)
    deadline = time.monotonic() + 30
    while group_members(job["pgid"]) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert group_members(job["pgid"]) == []


@pytest.mark.spawn
@pytest.mark.distributed
def test_rank_zero_alone_evaluates_under_two_gloo_ranks(tmp_path, tiny_model, data_root):
    suite = tiny_suite(tmp_path / "suite")
    spec = {"model": tiny_model, "out": str(tmp_path / "run"), "max_steps": 1,
            "eval": eval_config(suite, eval_baseline=False)}
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    proc = subprocess.run([*torchrun, str(REPO / "tests" / "eval_callback_run.py"), str(tmp_path / "spec.json")],
                          check=False, capture_output=True, text=True, timeout=900, cwd=REPO,
                          env=dict(os.environ, PYTHONPATH=str(REPO / "tests"), OMP_NUM_THREADS="1"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    ranks = {r: json.loads((tmp_path / "run" / f"rank{r}.json").read_text()) for r in (0, 1)}
    assert [j["step"] for j in ranks[0]["jobs"]] == [1] and ranks[1]["jobs"] == [] and ranks[1]["logged"] == []
    assert [j["rank"] for j in ranks[0]["jobs"]] == [0]  # started by the process of RANK 0
    assert [e["eval/step"] for e in ranks[0]["logged"]] == [1]
    assert sorted(p.name for p in (tmp_path / "run" / "eval_logs").iterdir() if p.is_dir()) == ["step-1"]


def test_eval_devices_errors_and_warnings(monkeypatch, tmp_path):
    with pytest.raises(RufusError, match="devices.eval is empty"):
        CheckpointEvalCallback({"eval_on_checkpoint": True}, devices={"eval": " "})
    CheckpointEvalCallback({"eval_on_checkpoint": False}, devices={"eval": ""})  # switch off: no check
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,2")
    with pytest.warns(UserWarning, match=r"evaluation devices \(0,1\) overlap the trainer's on GPU 1 \(the trainer's "
                      r"GPUs: 1,2\)"):
        callback = CheckpointEvalCallback({"eval_on_checkpoint": True})  # default devices.eval "0,1"
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "x")
    argv, env = callback.eval_command(tmp_path, 7, tmp_path / "staged")
    assert env["CUDA_VISIBLE_DEVICES"] == "0,1"  # verbatim, not the trainer's "1,2"
    assert not {"RANK", "WORLD_SIZE", "TORCHELASTIC_RUN_ID"} & set(env)  # never joins the trainer's rendezvous
    assert argv[-2:] == ["--request", str(tmp_path / "eval_logs" / "step-7" / "job.json")]  # the request, whole
    assert callback.request_for(tmp_path, 7, tmp_path / "staged").run_name == "model-checkpoint-7"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        CheckpointEvalCallback({"eval_on_checkpoint": True}, devices={"eval": "0,1"})  # no overlap: no warning


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


# ------------------------------------------------------------------ baseline, resume, staging cleanup


def quick_evaluator(tmp_path, monkeypatch, seconds: float = 0.0, **config) -> CheckpointEvalCallback:
    """A callback whose evaluation is a stand-in process (sleeps `seconds`, then exits 0)."""
    starting_model = config.pop("starting_model", None)
    evaluator = CheckpointEvalCallback({"eval_on_checkpoint": True, "backend": "hf", **config}, starting_model)
    monkeypatch.setattr(evaluator, "eval_command", lambda output_dir, step, staged: (
        [sys.executable, "-c", f"import time; time.sleep({seconds})"], dict(os.environ)))
    return evaluator


def save_checkpoint(out: Path, step: int, size: int = 1000) -> Path:
    checkpoint = out / f"checkpoint-{step}"
    checkpoint.mkdir(parents=True)
    (checkpoint / "model.safetensors").write_bytes(b"w" * size)
    (checkpoint / "config.json").write_text("{}")
    (checkpoint / "optimizer.pt").write_bytes(b"o" * size)
    return checkpoint


def train_state(step: int, stop: bool = False):
    return (SimpleNamespace(is_world_process_zero=True, global_step=step, log_history=[]),
            SimpleNamespace(should_training_stop=stop))


def test_baseline_is_the_starting_model_folder_and_a_resumed_run_has_none(tmp_path, monkeypatch, tiny_model):
    """Nothing is saved for the baseline (under FSDP or ZeRO-3 rank 0 holds only shards): the
    starting model's folder is evaluated as step 0. A resumed run evaluates nothing at its start."""
    args = SimpleNamespace(output_dir=str(tmp_path / "run"), report_to=[])
    model = SimpleNamespace(name_or_path=tiny_model)  # what from_pretrained leaves on a model
    evaluator = quick_evaluator(tmp_path, monkeypatch)
    evaluator.on_train_begin(args, *train_state(0), model=model)
    assert evaluator.wait(30)
    assert [(j["step"], j["model"]) for j in evaluator.jobs] == [(0, tiny_model)]
    assert not (tmp_path / "run" / STAGING).exists()

    resumed = quick_evaluator(tmp_path, monkeypatch, starting_model="tiny-random")
    resumed.on_train_begin(args, *train_state(4), model=model)
    assert resumed.jobs == []  # no "step 0" of the resumed weights
    save_checkpoint(tmp_path / "run", 6)
    resumed.on_save(args, *train_state(6))
    assert resumed.wait(30) and [j["step"] for j in resumed.jobs] == [6]  # the first evaluation: its real step


def test_a_resumed_run_keeps_its_eval_curve_up_to_the_resumed_step(tmp_path, monkeypatch):
    """After a kill, resumed at step 4: eval_logs/metrics.jsonl keeps the evaluations up to step
    4 and drops step 6 (evaluated again when the run gets there); step 3's evaluation, finished
    after the killed job's last log, is logged; step 4's, started and never finished, runs again."""
    out = tmp_path / "run"
    logs = out / "eval_logs"
    logs.mkdir(parents=True)
    (logs / "metrics.jsonl").write_text("".join(json.dumps({"eval/nocomma": 0.5, "eval/step": step}) + "\n"
                                                for step in (0, 2, 6)))
    (logs / "step-3").mkdir()
    (logs / "step-3" / "results.json").write_text(json.dumps({"tasks": {"nocomma": {"value": 0.25}}}))
    (logs / "step-4").mkdir()
    (logs / "step-4" / "job.json").write_text("{}")
    save_checkpoint(out, 4)
    evaluator = quick_evaluator(tmp_path, monkeypatch)
    results = json.dumps({"tasks": {"nocomma": {"value": 0.75}}})
    write_results = f"import pathlib; pathlib.Path({str(logs / 'step-4' / 'results.json')!r}).write_text({results!r})"
    monkeypatch.setattr(evaluator, "eval_command", lambda output_dir, step, staged: (
        [sys.executable, "-c", write_results], dict(os.environ)))
    state, control = train_state(4)
    evaluator.on_train_begin(SimpleNamespace(output_dir=str(out), report_to=[]), state, control, model=None)
    assert [(j["step"], Path(j["model"]).name) for j in evaluator.jobs] == [(4, "checkpoint-4")]  # no baseline
    assert evaluator.wait(30)
    evaluator.drain(state)
    curve = [json.loads(line) for line in (logs / "metrics.jsonl").read_text().splitlines()]
    assert [(c["eval/step"], c["eval/nocomma"]) for c in curve] == [(0, 0.5), (2, 0.5), (3, 0.25), (4, 0.75)]


def test_staged_checkpoint_removed_once_evaluated_and_its_disk_reported(tmp_path, monkeypatch):
    out = tmp_path / "run"
    args = SimpleNamespace(output_dir=str(out))
    evaluator = quick_evaluator(tmp_path, monkeypatch, seconds=1.0)
    checkpoint = save_checkpoint(out, 2, size=5000)
    evaluator.on_save(args, *train_state(2))
    staged = out / STAGING / "checkpoint-2"
    assert (staged / "model.safetensors").stat().st_ino == (checkpoint / "model.safetensors").stat().st_ino
    shutil.rmtree(checkpoint)  # save_total_limit rotates it away while it is evaluated
    assert evaluator.wait(30)
    assert not staged.exists()  # the evaluation is over: the staged copy is gone, its disk freed
    usage = [json.loads(line) for line in (out / "eval_logs" / STAGING_LOG).read_text().splitlines()]
    assert usage == [{"step": 2, "bytes": 5002, "only_here_bytes": 5002, "removed": True}]  # weights + config

    kept = quick_evaluator(tmp_path, monkeypatch, keep_staging=True)
    save_checkpoint(out, 4, size=300)
    kept.on_save(args, *train_state(4))
    assert kept.wait(30) and (out / STAGING / "checkpoint-4" / "model.safetensors").exists()
    assert kept.staging == [{"step": 4, "bytes": 302, "only_here_bytes": 0, "removed": False}]  # all shared


def test_last_checkpoint_waits_for_the_running_evaluation(tmp_path, monkeypatch):
    out = tmp_path / "run"
    args = SimpleNamespace(output_dir=str(out))
    evaluator = quick_evaluator(tmp_path, monkeypatch, seconds=2.0)
    for step, last in ((2, False), (3, False), (4, True)):
        save_checkpoint(out, step)
        evaluator.on_save(args, *train_state(step, stop=last))
    assert evaluator.skipped == [3]  # arrived while checkpoint-2 was evaluated
    assert [j["step"] for j in evaluator.jobs] == [2, 4]  # the last one waited, then was evaluated


# ------------------------------------------------------------------ sharded checkpoints


@pytest.fixture(scope="module")
def small_model(tiny_model):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)


def save_sharded_like_accelerate(state_dict: dict, checkpoint: Path) -> None:
    """What accelerate's save_fsdp_model writes for SHARDED_STATE_DICT: {"model": state} in DCP
    format under pytorch_model_fsdp_0/ (written here by one process, as its reader sees it)."""
    import torch.distributed.checkpoint as dcp

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # DCP notes it runs without a process group
        dcp.save({"model": state_dict}, storage_writer=dcp.FileSystemWriter(str(checkpoint / "pytorch_model_fsdp_0")))
    for name in ("scheduler.pt", "trainer_state.json", "rng_state_0.pth"):
        (checkpoint / name).write_text("x")
    (checkpoint / "optimizer_0").mkdir()


def test_fsdp_sharded_checkpoint_is_staged_and_consolidated(tmp_path, small_model, tiny_tokenizer):
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    checkpoint = tmp_path / "run" / "checkpoint-3"
    checkpoint.mkdir(parents=True)
    save_sharded_like_accelerate(small_model.state_dict(), checkpoint)
    assert sharded_kind(checkpoint) == "fsdp"
    staged = tmp_path / "run" / STAGING / "checkpoint-3"
    stage_checkpoint(checkpoint, staged)
    assert sorted(p.name for p in staged.iterdir()) == ["pytorch_model_fsdp_0"]  # the shards, linked; no optimizer
    write_model_files(staged, small_model, tiny_tokenizer)
    evaluator = CheckpointEvalCallback({"eval_on_checkpoint": True, "backend": "hf"})
    argv, _ = evaluator.eval_command(tmp_path / "run", 3, staged)
    assert argv[:5] == [sys.executable, "-m", "rufus_eval.staging", str(staged), "--"]  # consolidated first
    assert argv[5:8] == [sys.executable, "-m", "rufus_eval.cli"]
    assert consolidate(staged) == "fsdp"
    assert not (staged / "pytorch_model_fsdp_0").exists() and sharded_kind(staged) is None
    weights = load_file(staged / "model.safetensors")
    original = small_model.state_dict()
    assert set(weights) == set(original)
    assert all(torch.equal(weights[k], original[k]) for k in original)
    loaded = AutoModelForCausalLM.from_pretrained(staged)  # config.json from the live model
    assert torch.equal(loaded.model.layers[1].mlp.up_proj.weight, small_model.model.layers[1].mlp.up_proj.weight)


def test_fsdp_sharded_lora_checkpoint_becomes_an_adapter(tmp_path, small_model, tiny_model):
    import copy

    from peft import LoraConfig, get_peft_model, get_peft_model_state_dict
    from safetensors.torch import load_file

    peft_model = get_peft_model(copy.deepcopy(small_model), LoraConfig(r=4, target_modules=["q_proj"], task_type="CAUSAL_LM"))
    with torch.no_grad():
        for name, param in peft_model.named_parameters():
            if "lora_B" in name:
                param.fill_(0.01)  # trained: B is no longer zero
    checkpoint = tmp_path / "checkpoint-2"
    checkpoint.mkdir()
    save_sharded_like_accelerate(peft_model.state_dict(), checkpoint)
    staged = tmp_path / "staged"
    stage_checkpoint(checkpoint, staged)
    write_model_files(staged, peft_model, None, base_model=tiny_model)
    assert json.loads((staged / "adapter_config.json").read_text())["base_model_name_or_path"] == tiny_model
    consolidate(staged)
    adapter = load_file(staged / "adapter_model.safetensors")
    expected = get_peft_model_state_dict(peft_model)
    assert set(adapter) == set(expected) and all(torch.equal(adapter[k], expected[k]) for k in expected)


def test_zero3_partitions_are_staged_and_their_consolidation_names_what_it_needs(tmp_path):
    checkpoint = tmp_path / "checkpoint-2"
    (checkpoint / "global_step2").mkdir(parents=True)
    (checkpoint / "global_step2" / "zero_pp_rank_0_mp_rank_00_model_states.pt").write_bytes(b"m")
    (checkpoint / "global_step2" / "bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt").write_bytes(b"o")
    (checkpoint / "latest").write_text("global_step2")
    (checkpoint / "config.json").write_text("{}")
    assert sharded_kind(checkpoint) == "deepspeed"
    staged = tmp_path / "staged"
    stage_checkpoint(checkpoint, staged)
    assert sorted(str(p.relative_to(staged)) for p in staged.rglob("*") if p.is_file()) == [
        "config.json", "global_step2/bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt",
        "global_step2/zero_pp_rank_0_mp_rank_00_model_states.pt", "latest"]
    with pytest.raises(RufusError, match="consolidating them needs the deepspeed package"):
        consolidate(staged)
    (checkpoint / "model.safetensors").write_bytes(b"w")  # zero3_save_16bit_model: gathered weights, no shards
    assert sharded_kind(checkpoint) is None


REPLACE_OUT = """import pathlib, shutil, sys
out = pathlib.Path(sys.argv[1])
print("evaluating", flush=True)
tmp = out.with_name(out.name + ".tmp")
tmp.mkdir()
(tmp / "results.json").write_text('{"tasks": {}}')
out.rename(out.with_name(".old"))
tmp.rename(out)
shutil.rmtree(out.with_name(".old"))
"""


def test_log_and_job_stay_beside_results_when_the_evaluation_replaces_its_folder(tmp_path, monkeypatch):
    """rufus-eval writes its run folder atomically (the folder the callback logged into is replaced)."""
    out = tmp_path / "run"
    evaluator = CheckpointEvalCallback({"eval_on_checkpoint": True, "backend": "hf"})
    monkeypatch.setattr(evaluator, "eval_command", lambda output_dir, step, staged: (
        [sys.executable, "-c", REPLACE_OUT, str(Path(output_dir) / "eval_logs" / f"step-{step}")], dict(os.environ)))
    save_checkpoint(out, 2)
    evaluator.on_save(SimpleNamespace(output_dir=str(out)), *train_state(2))
    assert evaluator.wait(30)
    step = out / "eval_logs" / "step-2"
    assert (step / "results.json").exists() and "evaluating" in (step / "eval.log").read_text()
    assert json.loads((step / "job.json").read_text())["step"] == 2
