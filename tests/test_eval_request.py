"""One evaluation request (rufus_eval/request.py): `rufus-eval suite`, the checkpoint evaluation and
the pipeline build the same request from the same settings; the checkpoint evaluation hands it to
its process whole (job.json), not as flags parsed back; `auto` is one policy, so a machine with a
GPU and no vLLM evaluates with hf whoever asks. Nothing here loads a model: `run_suite` is
replaced by one that keeps the request it is given."""

from __future__ import annotations

import json
import re
import sys
from types import SimpleNamespace

import pytest
from typer.main import get_command
from typer.testing import CliRunner

from rufus_data.base.cli_options import RENAMED_ATTRIBUTE
from rufus_data.base.errors import RufusError
from rufus_data.generate import backend_config
from rufus_data.models import devices
from rufus_eval import runner
from rufus_eval.checkpoint_eval.callback import CheckpointEvalCallback
from rufus_eval.cli import app
from rufus_eval.request import EvalRequest, EvalSettings, request_from_cli
from rufus_train.pipeline import StageEval, stage_request

SETTINGS = {"suite": "quick", "tasks": ["gsm8k"], "limit": 2, "repeats": 1, "max_tokens": 16, "temperature": 0.0,
            "backend": "auto"}
CLI = ["suite", "quick", "--tasks", "gsm8k", "--limit", "2", "--repeats", "1", "--max-tokens", "16", "--temperature", "0",
       "--backend", "auto"]
ROLES = {"trainer": "0", "eval": "1"}
# the options `rufus-eval suite` had when it declared its own: none may go away (but --db: runs write no
# database any more, `rufus-eval results` reads their results.json)
FLAGS_BEFORE = {"--ckpt", "--backend", "--limit", "--out", "--final", "--step", "--name", "--base-url", "--tokenizer",
                "--devices", "--data-parallel-size", "--samples", "--max-tokens", "--task", "--strict"}


def settings_of(request: EvalRequest) -> dict:
    """The settings, but the GPUs: those are the evaluation's role (the callback's devices.eval)."""
    return request.model_dump(include=set(EvalSettings.model_fields) - {"devices"})


@pytest.fixture
def requests_run(monkeypatch) -> list[EvalRequest]:
    """Every request `run_suite` is given, kept instead of run."""
    seen: list[EvalRequest] = []
    monkeypatch.setattr(runner, "run_suite", lambda request, fmt="table": seen.append(request))
    return seen


@pytest.fixture
def gpu_without_vllm(monkeypatch):
    """The drift's machine: a GPU is visible, vLLM is not installed (the one count and the one check)."""
    monkeypatch.setattr(devices, "gpu_count", lambda: 1)
    monkeypatch.setattr(backend_config, "vllm_available", lambda: False)


def test_cli_callback_and_pipeline_build_one_request_and_pick_one_backend(tmp_path, requests_run, gpu_without_vllm):
    result = CliRunner().invoke(app, [*CLI, "--ckpt", "tiny-random"])
    assert result.exit_code == 0, result.output
    (from_cli,) = requests_run
    evaluator = CheckpointEvalCallback({"eval_on_checkpoint": True, **SETTINGS}, devices=ROLES)
    from_callback = evaluator.request_for(tmp_path / "run", 2, tmp_path / "run" / "checkpoint-2")
    from_pipeline = stage_request("tiny-random", StageEval(**SETTINGS), tmp_path / "pipeline", "00-base")
    assert settings_of(from_cli) == settings_of(from_callback) == settings_of(from_pipeline)
    # the callback no longer decides `auto` itself: its request says auto, with the evaluation's GPUs
    assert (from_callback.backend, from_callback.devices) == ("auto", "1")
    # one policy, where the evaluation runs: a GPU without vLLM is hf for all three
    assert {r.resolved().backend for r in (from_cli, from_callback, from_pipeline)} == {"hf"}
    assert from_callback.resolved().access().devices == "1"


def test_the_checkpoint_evaluation_hands_its_request_over_whole(tmp_path, monkeypatch, requests_run):
    """The evaluation process reads its request from job.json (`rufus-eval suite --request`), and
    gets exactly the request the callback built."""
    evaluator = CheckpointEvalCallback({"eval_on_checkpoint": True, "tag": "tiny", **SETTINGS}, devices=ROLES)
    run = tmp_path / "run"
    argv, _ = evaluator.eval_command(run, 3, run / "checkpoint-3")
    job_file = run / "eval_logs" / "step-3" / "job.json"
    assert argv == [sys.executable, "-m", "rufus_eval.cli", "suite", "--request", str(job_file)]
    monkeypatch.setattr(evaluator, "eval_command", lambda output_dir, step, model: ([sys.executable, "-c", "pass"], {}))
    evaluator._start(SimpleNamespace(output_dir=str(run)), 3, run / "checkpoint-3")
    assert evaluator.wait(30)
    job = json.loads(job_file.read_text())
    expected = evaluator.request_for(run, 3, run / "checkpoint-3")
    assert EvalRequest(**job["request"]) == expected and job["name"] == "tiny-checkpoint-3"

    for extra in ([], ["--limit", "5"]):  # options given beside the file override it
        result = CliRunner().invoke(app, ["suite", "--request", str(job_file), *extra])
        assert result.exit_code == 0, result.output
    assert requests_run == [expected, expected.model_copy(update={"limit": 5})]


def test_suite_options_are_the_request_fields():
    params = {p.name: p for p in get_command(app).commands["suite"].params}
    for name, info in EvalRequest.model_fields.items():
        assert params[name].help == info.description, name
    flags = {flag for param in params.values() for flag in param.opts}
    renamed = set(getattr(get_command(app).commands["suite"].callback, RENAMED_ATTRIBUTE))
    assert flags | renamed >= FLAGS_BEFORE | {"--temperature", "--request", "--tasks"}  # old names still parse


def test_tasks_are_given_as_lm_eval_gives_them_or_one_by_one(requests_run):
    """`--tasks a,b` (lm-eval's spelling), `--task a --task b` (Rufus's old one) and a mix are one request."""
    cli = CliRunner()
    for tasks in (["--tasks", "gsm8k,math500"], ["--task", "gsm8k", "--task", "math500"],
                  ["--tasks", "gsm8k", "--tasks=math500"], ["--tasks", "gsm8k, math500,"]):
        result = cli.invoke(app, ["suite", "quick", "--ckpt", "m", *tasks])
        assert result.exit_code == 0, result.output
        assert "--task " not in result.output  # an alias, not a rename: no note
    assert [r.tasks for r in requests_run] == [["gsm8k", "math500"]] * 4
    assert len({r.model_dump_json() for r in requests_run}) == 1


def test_a_request_that_cannot_run_is_refused_before_anything_loads(requests_run):
    cli = CliRunner()
    missing = cli.invoke(app, ["suite", "--limit", "2"])
    assert missing.exit_code == 2 and "give a suite NAME and --ckpt MODEL" in missing.output
    greedy = cli.invoke(app, ["suite", "quick", "--ckpt", "m", "--temperature", "0"])
    assert greedy.exit_code == 2 and "greedy decoding (temperature 0) gives k copies of one answer" in greedy.output
    assert requests_run == []
    with pytest.raises(ValueError, match="Input should be 'auto', 'hf' or 'vllm'"):
        StageEval(backend="server")  # a stage's model is loaded or served by Rufus, never someone else's server


def test_temperature_is_an_override_like_repeats_and_max_tokens():
    from rufus_data.benchmarks.suite import load_suite
    from rufus_eval.request import apply_sampling_overrides

    suite = load_suite("quick")
    apply_sampling_overrides(suite, EvalRequest(suite="quick", checkpoint="m", repeats=1, max_tokens=8, temperature=0.0))
    assert {(suite.k(t), suite.sampling_for(t).temperature, suite.sampling_for(t).max_tokens) for t in suite.tasks} == {
        (1, 0.0, 8)}
    untouched = load_suite("quick")
    apply_sampling_overrides(untouched, EvalRequest(suite="quick", checkpoint="m"))
    assert [untouched.sampling_for(t) for t in untouched.tasks] == [load_suite("quick").sampling_for(t)
                                                                    for t in load_suite("quick").tasks]



def test_a_job_file_from_before_the_results_database_went_still_runs(tmp_path, capsys):
    """A checkpoint evaluation's job.json written by an older Rufus names db_path: said, then ignored."""
    job = tmp_path / "job.json"
    job.write_text(json.dumps({"request": {"suite": "quick", "checkpoint": "smollm2-135m", "db_path": "old.duckdb"}}))
    req = request_from_cli({}, job)
    assert (req.suite, req.checkpoint) == ("quick", "smollm2-135m") and "db_path" not in req.model_dump()
    assert "db_path old.duckdb is no longer used" in capsys.readouterr().err


def test_samples_is_now_repeats_and_the_old_name_still_works(tmp_path, requests_run, capsys):
    """k is `repeats` (lm-eval's --samples picks documents): `--samples 2` parses as `--repeats 2`
    with a note, and an older job.json, a stage's or pipeline's `eval:` block saying `samples` reads."""
    result = CliRunner().invoke(app, ["suite", "quick", "--ckpt", "m", "--samples", "2"])
    assert result.exit_code == 0, result.output
    assert requests_run[-1].repeats == 2
    assert "note: --samples is now --repeats (lm-eval's --samples picks documents" in " ".join(result.output.split())
    assert CliRunner().invoke(app, ["suite", "quick", "--ckpt", "m", "--repeats", "2"]).exit_code == 0
    assert requests_run[-1] == requests_run[-2]
    assert "--samples" not in CliRunner().invoke(app, ["suite", "--help"], terminal_width=200).output

    job = tmp_path / "job.json"
    job.write_text(json.dumps({"request": {"suite": "quick", "checkpoint": "m", "samples": 3, "temperature": 0.6}}))
    assert request_from_cli({}, job).repeats == 3
    assert f"--request {job}: `samples` is now `repeats`" in " ".join(capsys.readouterr().err.split())
    assert request_from_cli({"repeats": 5}, job).repeats == 5  # an option beside the file still wins
    job.write_text(json.dumps({"suite": "quick", "checkpoint": "m", "samples": 3, "repeats": 3}))
    with pytest.raises(RufusError, match="give only `repeats`"):
        request_from_cli({}, job)
    assert CheckpointEvalCallback({"samples": 2}, devices=ROLES).config.repeats == 2
    assert StageEval(samples=2, temperature=0.6).repeats == 2


@pytest.mark.parametrize(("key", "value", "says"), [
    ("devices", "1", 'write `devices: {eval: "1"}`'), ("base_urls", ["http://h:1"], "never reached at a server"),
    ("served_model_name", "m", "<tag>-checkpoint-N"), ("tokenizer", "t", "a checkpoint folder holds its tokenizer")])
def test_a_checkpoint_evaluation_refuses_what_it_sets_itself(key, value, says):
    """Request settings the checkpoint evaluation decides (its GPUs, its served name, its model's
    tokenizer, no foreign server): refused naming why, and `stage --help` says so beside the key."""
    from rufus_eval.checkpoint_eval.config import CheckpointEvalConfig

    with pytest.raises(ValueError, match=re.escape(says)):
        CheckpointEvalConfig(**{key: value})
    assert CheckpointEvalConfig.model_fields[key].description.startswith("not here")
