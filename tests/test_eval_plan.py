"""`rufus-eval suite --dry-run` (rufus_eval/plan.py): the plan of a run, from the run's own code,
with nothing loaded or written: the tasks to run and to skip (with the reason and fetch command
the run records), the backend and why, the resolved request as JSON. `no_model_loads` fails a
test the moment a model loads or lm-eval evaluates."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rufus_data.models import devices
from rufus_eval.cli import app
from rufus_eval.request import EvalRequest


@pytest.fixture
def gsm8k_only(tmp_path, monkeypatch, data_root) -> Path:
    """A data root that holds GSM8K's test set alone, offline, on a machine without a GPU; the
    working folder is an empty one, so anything a command writes shows."""
    root = tmp_path / "data"
    (root / "gsm8k").mkdir(parents=True)
    (root / "gsm8k" / "test.jsonl").symlink_to(data_root / "gsm8k" / "test.jsonl")
    monkeypatch.setenv("RUFUS_DATA_ROOT", str(root))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(devices, "gpu_count", lambda: 0)
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    return cwd


def written(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


def test_the_dry_run_prints_the_plan_and_writes_nothing(gsm8k_only, no_model_loads, tiny_model):
    result = CliRunner().invoke(app, ["suite", "quick", "--ckpt", "tiny-random", "--tasks", "gsm8k,math500",
                                      "--limit", "2", "--repeats", "1", "--dry-run"])
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "backend: hf (auto: no GPU, so transformers in-process)" in out
    assert f"model: built-in tiny-random: {tiny_model}" in out and "step: 0 (base model" in out
    rows = {line.split("│")[1].strip(): [cell.strip() for cell in line.split("│")[2:-1]]
            for line in out.splitlines() if line.startswith("│")}
    fetch = "rufus-eval data pull quick --tasks math500 --to $RUFUS_DATA_ROOT"
    # task: metric, k, max_tokens, temperature, limit, docs, plan, why
    assert rows["gsm8k"] == ["avg@1", "1", "256", "0.6", "2", "1319", "run", ""]
    assert rows["math500"] == ["avg@1", "1", "256", "0.6", "2", "-", "skip", f"data not here: {fetch}"]
    assert "skip math500: task math500 could not be loaded" in out and f"to get it: {fetch}" in out
    request = json.loads(out[out.index("{", out.index("request (")):])
    assert EvalRequest(**request) == EvalRequest(suite="quick", checkpoint="tiny-random", tasks=["gsm8k", "math500"],
                                                 limit=2, repeats=1, backend="hf")
    assert written(gsm8k_only) == []  # no run folder, no work folder, no lock


def test_the_plan_skips_what_the_run_skips_for_the_same_reason(gsm8k_only, tmp_path):
    """The dry run and the run decide a task's data by one function: same reason, same command."""
    from rufus_eval.plan import plan_tasks, resolve
    from rufus_eval.runner import prepare_tasks

    resolved = resolve(EvalRequest(suite="quick", checkpoint="tiny-random", limit=1), say=False)
    planned = {t.task: t.skip for t in plan_tasks(resolved.suite, resolved.tasks)}
    lm_names, skipped = prepare_tasks(resolved.suite, resolved.tasks, tmp_path / "tasks")
    assert {name: why for name, why in planned.items() if why} == skipped
    assert [name for name, why in planned.items() if not why] == list(lm_names) == ["gsm8k"]


def test_the_plan_as_json_and_from_a_job_file(gsm8k_only, no_model_loads, tmp_path):
    job = tmp_path / "job.json"
    job.write_text(json.dumps({"request": {"suite": "quick", "checkpoint": "tiny-random", "tasks": ["gsm8k"],
                                           "samples": 1, "limit": 3}}))
    result = CliRunner().invoke(app, ["suite", "--request", str(job), "--dry-run", "--format", "json", "--limit", "5"])
    assert result.exit_code == 0, result.output
    plan = json.loads(result.stdout)
    assert (plan["backend"], plan["backend_why"]) == ("hf", "auto: no GPU, so transformers in-process")
    assert [(t["task"], t["run"], t["k"], t["limit"], t["docs"]) for t in plan["tasks"]] == [("gsm8k", True, 1, 5, 1319)]
    assert plan["request"]["repeats"] == 1 and plan["request"]["limit"] == 5  # the old key read, the option wins
    assert "`samples` is now `repeats`" in " ".join(result.stderr.split())
    assert written(gsm8k_only) == []


def test_a_dry_run_refuses_what_the_run_would_refuse(gsm8k_only, no_model_loads):
    strict = CliRunner().invoke(app, ["suite", "quick", "--ckpt", "tiny-random", "--tasks", "gsm8k,math500", "--strict",
                                      "--dry-run"])
    assert strict.exit_code == 2 and "--strict: math500: task math500 could not be loaded" in strict.stderr
    assert "skip math500" in strict.stdout  # the plan first, then why the run would stop
    nothing = CliRunner().invoke(app, ["suite", "quick", "--ckpt", "tiny-random", "--tasks", "ifeval", "--dry-run"])
    assert nothing.exit_code == 2 and "no task of suite quick can run here: ifeval" in nothing.stderr
    missing = CliRunner().invoke(app, ["suite", "quick", "--ckpt", "no-such/model", "--dry-run"])
    assert missing.exit_code == 2 and "HF_HUB_OFFLINE is set and it is not in the Hugging Face cache" in missing.stderr
    assert "Traceback" not in strict.output + nothing.output + missing.output
    assert written(gsm8k_only) == [] and os.environ["HF_HUB_OFFLINE"] == "1"


def test_data_only_the_hub_has_is_planned_as_downloaded_not_fetched(gsm8k_only, no_model_loads, monkeypatch):
    """With the hub reachable the run would download MATH-500; the plan says so and asks the hub for nothing."""
    from rufus_eval import plan

    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setattr(plan, "hub_unreachable", lambda: None)
    monkeypatch.setattr(plan, "offline_mode", lambda: False)  # `datasets`, imported offline by lm-eval, stays so
    result = CliRunner().invoke(app, ["suite", "quick", "--ckpt", "tiny-random", "--tasks", "gsm8k,math500", "--dry-run",
                                      "--format", "json"])
    assert result.exit_code == 0, result.output
    math500 = next(t for t in json.loads(result.stdout)["tasks"] if t["task"] == "math500")
    assert math500["run"] and math500["reason"] is None
    if math500["docs"] is None:  # not in this machine's datasets cache either
        assert math500["note"] == "not here; the run downloads it from the hub"
    assert "HF_HUB_OFFLINE" not in os.environ  # forced offline only while the plan looked


def test_a_suite_names_every_task_it_leaves_out_and_keeps_maintainers_warnings_off_screen(capsys):
    """smollm3 without --final: its four test tasks are named with why; the shipped registry's
    unpinned livecodebench revision is for Rufus's maintainers (the log), not the screen."""
    from rufus_data.benchmarks.suite import load_suite
    from rufus_eval.plan import dry_run, left_out
    from rufus_eval.request import EvalRequest

    suite = load_suite("smollm3")
    plan = dry_run(EvalRequest(suite="smollm3", checkpoint="tiny-random", backend="hf"))
    err = capsys.readouterr().err
    tests = [t.name for t in suite.tasks if t.role == "test"]
    assert len(tests) == 4 and plan["not_run"] == dict.fromkeys(tests, "a test task: it runs with --final")
    assert all(f"not run {name}: a test task: it runs with --final" in err for name in tests)
    assert len(plan["tasks"]) + len(plan["not_run"]) == len(suite.tasks)
    assert "WARNING" not in err and "revision 'main'" not in err
    picked = [t for t in suite.tasks if t.name == "aime25"]
    assert left_out(suite, picked, final=True)["ifeval"] == "not in --tasks"
