"""A new user's first mistakes, through the three CLIs in-process (issue 46): a misspelt model is
one paragraph with a did-you-mean and the built-ins, exit 2, before any work and without asking the
hub; a missing data root is said by --dry_run; a run folder left by a failed run is taken over."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from rufus_data.cli import app as data_app
from rufus_eval.cli import app as eval_app
from rufus_train.cli import app as train_app


def invoke(app, *args: str, **env: str):
    return CliRunner().invoke(app, list(args), env={"COLUMNS": "200", **env})


def said(result) -> str:
    return " ".join(result.output.split())


@pytest.fixture
def no_hub(monkeypatch):
    """A typo of a built-in is answered without asking the hub (or its cache) anything."""
    def asked(repo):
        raise AssertionError(f"the hub was asked about {repo}")

    monkeypatch.setattr("rufus_data.models.reference.model_unavailable", asked)


def assert_did_you_mean(result) -> None:
    text = said(result)
    assert result.exit_code == 2, result.output
    assert "model 'smollm2-13m' cannot be loaded" in text and "Did you mean 'smollm2-135m'?" in text
    assert "The built-ins: smollm2-135m (" in text and "tiny-random (" in text
    assert "Traceback" not in result.output


@pytest.mark.parametrize("dry_run", [["--dry_run"], []])
def test_rufus_train_refuses_a_misspelt_model_before_any_work(dry_run, tmp_path, no_hub, no_model_loads):
    result = invoke(train_app, "stage", "sft", "--model", "smollm2-13m", "--max_steps", "2",
                    "--output_dir", str(tmp_path / "run"), *dry_run)
    assert_did_you_mean(result)
    assert not (tmp_path / "run").exists()  # nothing mixed, no run folder begun


def test_rufus_eval_and_rufus_data_answer_the_same_typo_the_same_way(tmp_path, no_hub, no_model_loads):
    assert_did_you_mean(invoke(eval_app, "suite", "quick", "--ckpt", "smollm2-13m", "--dry-run"))
    assert_did_you_mean(invoke(data_app, "filter", "--policy", "smollm2-13m", "--out", str(tmp_path / "f"),
                               "--dry-run"))


def test_rufus_train_dry_run_says_the_data_root_is_missing(tmp_path, monkeypatch, no_model_loads):
    monkeypatch.delenv("RUFUS_DATA_ROOT")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # online, the hub would supply the catalog's sources
    result = invoke(train_app, "stage", "sft", "--dry_run", "--output_dir", str(tmp_path / "run"))
    assert result.exit_code == 2, result.output
    assert "data catalogs/data/sft_mixture.yaml: source" in said(result) and "RUFUS_DATA_ROOT is not set" in said(result)
    assert "config valid" not in result.output


def test_a_failed_runs_folder_does_not_block_the_corrected_command(tmp_path, no_model_loads):
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("stage: sft\n")
    (run / "train.log").write_text("error: model 'smollm2-13m' cannot be loaded\n")
    result = invoke(train_app, "stage", "sft", "--model", "tiny-random", "--output_dir", str(run), "--dry_run")
    assert result.exit_code == 0, result.output
    (run / "checkpoint-4").mkdir()
    refused = invoke(train_app, "stage", "sft", "--model", "tiny-random", "--output_dir", str(run), "--dry_run")
    assert refused.exit_code == 2 and "already holds a run (checkpoint-4): pass --overwrite" in said(refused)
