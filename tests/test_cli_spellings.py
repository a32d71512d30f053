"""TRL's and lm-eval's spellings (rufus_data/base/borrowed_options.py): every entry of both tables is
fed through its CLI in-process (a dry run) and shows what it maps to, or its refusal, exit 2;
docs/spellings.md is the tables rendered; `--limit` on sampled tasks says N x k up front."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rufus_eval.cli import app as eval_app
from rufus_eval.lm_eval_spellings import LM_EVAL_SPELLINGS
from rufus_train.cli import app as train_app
from rufus_train.trl_spellings import TRL_SPELLINGS

REPO = Path(__file__).resolve().parents[1]


def fed(entry) -> list[str]:
    return [entry.name, *(entry.example.split() if entry.example else [])]


def said(result) -> str:
    return " ".join(result.output.split())


@pytest.mark.parametrize("entry", TRL_SPELLINGS, ids=lambda e: e.name)
def test_each_trl_spelling_through_rufus_train_stage(entry, tmp_path, no_model_loads):
    result = CliRunner().invoke(train_app, ["stage", "sft", "--dry_run", "--model", "tiny-random",
                                            "--output_dir", str(tmp_path / "run"), *fed(entry)], env={"COLUMNS": "200"})
    taken_or_refused(result, entry, "TRL's")


def taken_or_refused(result, entry, whose: str) -> None:
    """A borrowed spelling is either taken, with its note and its Rufus value in the plan, or
    refused (exit 2) with the line that says where Rufus keeps the setting; never a traceback."""
    assert "Traceback" not in result.output and "No such option" not in result.output
    if result.exit_code == 2:
        assert entry.shows in said(result), result.output
        return
    assert result.exit_code == 0, result.output
    assert f"note: {entry.name}" in said(result) and f"is {whose} spelling" in said(result)
    assert entry.shows in result.stdout, result.stdout


@pytest.mark.parametrize("entry", LM_EVAL_SPELLINGS, ids=lambda e: e.name)
def test_each_lm_eval_spelling_through_rufus_eval_suite(entry, no_model_loads):
    result = CliRunner().invoke(eval_app, ["suite", "quick", "--ckpt", "tiny-random", "--dry-run", *fed(entry)],
                                env={"COLUMNS": "200"})
    taken_or_refused(result, entry, "lm-eval's")


def test_model_args_key_without_a_rufus_setting_says_where_it_lives(no_model_loads):
    result = CliRunner().invoke(eval_app, ["suite", "quick", "--ckpt", "tiny-random", "--dry-run",
                                           "--model_args", "pretrained=tiny-random,trust_remote_code=True"])
    assert result.exit_code == 2 and "--model_args trust_remote_code=True: Rufus keeps no such setting" in said(result)
    assert "--vllm-command" in said(result)


def test_limit_on_sampled_tasks_says_questions_times_samples(no_model_loads):
    result = CliRunner().invoke(eval_app, ["suite", "quick", "--ckpt", "tiny-random", "--dry-run", "--limit", "4",
                                           "--tasks", "gsm8k"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "note: --limit 4 picks 4 questions per task, each answered k times: gsm8k 4 x 4 = 16" in said(result)


def test_the_docs_table_is_the_code_s():
    spec = importlib.util.spec_from_file_location("spellings_doc", REPO / "scripts" / "spellings_doc.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert (REPO / "docs" / "spellings.md").read_text() == module.rendered(), "run scripts/spellings_doc.py"
