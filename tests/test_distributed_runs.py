"""Real multi-process runs on CPU (gloo), each with checkpoint evaluation every 2 steps:
- a 2-process SFT run and a 2-process synchronous GRPO run, launched by
  `rufus-train stage NAME --num_processes 2 --accelerate_config ddp` (Rufus starts accelerate);
- FSDP2: accelerate runs FSDP only on GPUs (on CPU it trains plain DDP, so Rufus refuses that
  launch), so a torchrun script shards the model with `fully_shard` and saves a
  SHARDED_STATE_DICT checkpoint with accelerate's own writer (tests/fsdp2_callback_run.py).
Each: the baseline (the starting model's folder) and every staged checkpoint are evaluated by
rank 0 only, their suite outputs (scores and every generated text) equal a single-process
evaluation of the same weights, the staging is gone afterwards, and nothing hangs (timeouts).
Tiny settings: the built-in tiny-random (the mechanics do not need a trained model), a one-task
suite of two prompts, 16 tokens. In CI: the 2-step SFT and GRPO runs under DDP and the FSDP2 run;
the 4-step GRPO run (two more evaluations, with the baseline compared to a separate evaluation of
the starting model) is opt-in (slow)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import example_shards
import pytest
import torch
from eval_callback_run import tiny_suite
from rl_prompts import arithmetic_rows, write_rl_shards
from safetensors.torch import load_file
from train_helpers import one_torch_thread

from rufus_data.models.reference import ModelRef
from rufus_eval.request import EvalRequest
from rufus_eval.runner import run_suite

pytestmark = [pytest.mark.usefixtures("one_torch_thread"), pytest.mark.spawn, pytest.mark.distributed]
_ = one_torch_thread
REPO = Path(__file__).resolve().parents[1]
EVAL_SETTINGS = {"limit": 2, "repeats": 1, "max_tokens": 16, "backend": "hf"}
ONE_THREAD = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO / "tests")}


@pytest.fixture(scope="module")
def suite(tmp_path_factory) -> str:
    """One task of two short local prompts (tests/eval_callback_run.py): the evaluations stay cheap."""
    return str(tiny_suite(tmp_path_factory.mktemp("suite")))


def stage_eval_args(suite: str) -> list[str]:
    settings = {"suite": suite, **EVAL_SETTINGS}
    return ["--eval.eval_on_checkpoint", *[a for k, v in settings.items() for a in (f"--eval.{k}", str(v))]]


def single_process_eval(model: str | Path, out: Path, suite: str) -> Path:
    """The suite on `model` in this one plain process (one torch thread, as the callback's
    evaluation runs), with the settings the callback's evaluation got."""
    run_suite(EvalRequest(suite=suite, checkpoint=str(model), backend="hf",
                          limit=2, repeats=1, max_tokens=16, out=out))
    return out


def outputs(run: Path) -> dict:
    """Per task: the score and every generated text, from an evaluation's results and samples."""
    record = json.loads((run / "results.json").read_text())
    found = {}
    for task, result in record["tasks"].items():
        lines = Path(result["samples_file"]).read_text().splitlines()
        found[task] = (result["value"], [json.loads(line)["resps"] for line in lines])
    return found


def evaluation_jobs(out: Path) -> list[dict]:
    return sorted((json.loads(p.read_text()) for p in (out / "eval_logs").glob("step-*/job.json")), key=lambda j: j["step"])


def run_stage_in_two_processes(stage: str, steps: int, suite: str, args: list[str]) -> None:
    argv = [sys.executable, "-m", "rufus_train.cli", "stage", stage, "--model", "tiny-random", "--num_processes", "2",
            "--accelerate_config", "ddp",
            "--max_steps", str(steps), "--save_steps", "2", "--logging_steps", "1", "--no-gradient_checkpointing", *args,
            *stage_eval_args(suite)]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=1500, cwd=REPO, env=ONE_THREAD, check=False)
    assert proc.returncode == 0, proc.stderr[-4000:]


@pytest.fixture(scope="module")
def starting_outputs(tiny_model, suite, tmp_path_factory) -> dict:
    return outputs(single_process_eval(tiny_model, tmp_path_factory.mktemp("starting") / "eval", suite))


def check_two_process_run(out: Path, last: int, suite: str, tmp_path: Path, starting_outputs: dict | None = None) -> None:
    checkpoint = out / f"checkpoint-{last}"
    assert (checkpoint / "rng_state_0.pth").exists() and (checkpoint / "rng_state_1.pth").exists()  # one 2-rank run
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    loss_steps = [m["step"] for m in metrics if "loss" in m]
    assert loss_steps == list(range(1, last + 1))  # logged by one process, not once per rank
    jobs = evaluation_jobs(out)
    assert all(job["rank"] == 0 for job in jobs)
    evaluated = [job["step"] for job in jobs]
    assert evaluated[0] == 0 and evaluated[-1] == last and set(evaluated) <= set(range(0, last + 1, 2))
    assert jobs[0]["model"] in ("tiny-random", ModelRef.of("tiny-random").path)  # the starting model itself
    assert (out / "eval_logs" / "step-0" / "results.json").exists()
    if starting_outputs is not None:
        assert outputs(out / "eval_logs" / "step-0") == starting_outputs
    assert outputs(out / "eval_logs" / f"step-{last}") == outputs(single_process_eval(checkpoint, tmp_path / "single", suite))
    staged = [json.loads(line) for line in (out / "eval_logs" / "staging.jsonl").read_text().splitlines()]
    assert [u["step"] for u in staged] == evaluated[1:] and all(u["removed"] for u in staged)
    assert not any((out / "_eval_staging").iterdir())  # every staged copy went once it was evaluated


def test_sft_in_two_processes_with_checkpoint_evaluation(data_root, suite, tiny_model, tmp_path):
    shards = example_shards.gsm8k_sft(data_root, tmp_path / "sft", limit=4, max_chars=200)
    out = tmp_path / "run"
    run_stage_in_two_processes("sft", 2, suite, ["--data", str(shards), "--output_dir", str(out), "--per_device_train_batch_size",
                                          "1", "--max_length", "96"])
    check_two_process_run(out, 2, suite, tmp_path)


@pytest.mark.parametrize("steps", [2, pytest.param(4, marks=pytest.mark.slow)])
def test_sync_grpo_in_two_processes_with_checkpoint_evaluation(steps, suite, tiny_model, tmp_path, request):
    shards = write_rl_shards(tmp_path / "rl", arithmetic_rows(8))
    out = tmp_path / "run"
    run_stage_in_two_processes("reasoning_rl", steps, suite, [
        "--data", str(shards), "--output_dir", str(out), "--per_device_train_batch_size", "2", "--num_generations", "2",
        "--max_completion_length", "16", "--stop_after_dead_steps", "0"])  # tiny-random's groups are dead: mechanics
    starting = request.getfixturevalue("starting_outputs") if steps == 4 else None  # slow: one more evaluation
    check_two_process_run(out, steps, suite, tmp_path, starting)


def test_fsdp2_sharded_checkpoint_is_consolidated_and_evaluated_on_rank_zero(tiny_model, suite, tmp_path):
    out, reference = tmp_path / "run", tmp_path / "reference"
    spec = {"model": tiny_model, "out": str(out), "reference": str(reference),
            "eval": {"eval_on_checkpoint": True, "keep_staging": True, "suite": suite, **EVAL_SETTINGS}}
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    proc = subprocess.run([*torchrun, str(REPO / "tests" / "fsdp2_callback_run.py"), str(tmp_path / "spec.json")],
                          capture_output=True, text=True, timeout=1500, cwd=REPO, env=ONE_THREAD, check=False)
    assert proc.returncode == 0, proc.stderr[-4000:]
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert ranks[1]["jobs"] == [] and [(j["step"], j["rank"]) for j in ranks[0]["jobs"]] == [(0, 0), (1, 0)]
    assert ranks[0]["jobs"][0]["model"] == tiny_model  # the baseline: the starting folder, nothing gathered
    assert (out / "eval_logs" / "step-0" / "results.json").exists()
    assert {"__0_0.distcp", "__1_0.distcp"} <= set(ranks[0]["shard_files"])  # both ranks wrote their shards
    staged = out / "_eval_staging" / "checkpoint-1"
    consolidated, gathered = load_file(staged / "model.safetensors"), load_file(reference / "model.safetensors")
    assert set(gathered) <= set(consolidated)
    assert all(torch.equal(consolidated[k], gathered[k]) for k in gathered)  # what FSDP2 gathers to rank 0
    assert outputs(out / "eval_logs" / "step-1") == outputs(single_process_eval(reference, tmp_path / "single-1", suite))
