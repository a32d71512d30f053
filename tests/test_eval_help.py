"""What rufus-eval's options say (help on each: tests/test_cli_surface.py): a choice shows and
checks its choices, a repeatable option reads `VALUE...`, and both spellings parse (`--max-tokens`,
as rufus-eval writes it, and `--max_tokens`, as TRL and lm-eval users type it). Nothing here runs
a suite, loads a model or pulls data: the commands' work is replaced by what keeps its arguments."""

from __future__ import annotations

import subprocess
import sys

import pytest
from cli_commands import leaf_commands
from typer.testing import CliRunner

from rufus_eval import runner
from rufus_eval.cli import app


def test_choices_are_shown_and_repeatable_options_read_value_dots():
    shown = {}
    for path, command in leaf_commands(app):
        for param in command.params:
            if param.param_type_name == "option" and param.name != "help":
                shown[(path, param.opts[0])] = param.metavar or ""
                if param.multiple:
                    assert param.metavar and param.metavar.endswith("..."), (path, param.opts, param.metavar)
    help_of = {path: CliRunner().invoke(app, [*path, "--help"], terminal_width=200).output for path, _ in leaf_commands(app)}
    for path in (("compare",), ("results",), ("suite",)):
        assert "<table|csv|json>" in help_of[path], path
    assert "<wandb|trackio>..." in help_of[("suite",)] and "<auto|hf|vllm|server>" in help_of[("suite",)]
    assert {shown[(("suite",), "--tasks")], shown[(("suite",), "--base-url")], shown[(("vibe",), "--ckpt")],
            shown[(("data", "pull"), "--tasks")]} == {"TASK...", "URL...", "MODEL..."}


@pytest.fixture
def requests_run(monkeypatch) -> list:
    seen: list = []
    monkeypatch.setattr(runner, "run_suite", lambda request, fmt="table": seen.append(request))
    return seen


def test_both_spellings_parse_and_a_bad_choice_is_refused(requests_run):
    cli = CliRunner()
    for spelled in (["--max-tokens", "8", "--report-to", "wandb", "--batch-size", "4"],
                    ["--max_tokens", "8", "--report_to", "wandb", "--batch_size=4"]):
        result = cli.invoke(app, ["suite", "quick", "--ckpt", "m", *spelled])
        assert result.exit_code == 0, result.output
    first, second = requests_run
    assert first == second and (first.max_tokens, first.report_to, first.batch_size) == (8, ["wandb"], 4)
    refused = cli.invoke(app, ["suite", "quick", "--ckpt", "m", "--report_to", "tensorboard"])
    assert refused.exit_code == 2 and "'tensorboard' is not one of wandb, trackio" in refused.output


def test_vibe_and_data_pull_take_their_generated_options(monkeypatch, tmp_path):
    from rufus_data.benchmarks import pull
    from rufus_eval import vibe

    asked: list = []
    monkeypatch.setattr(vibe, "run_vibe", lambda prompts, ckpts, **how: asked.append((prompts, ckpts, how)))
    result = CliRunner().invoke(app, ["vibe", "p.yaml", "--ckpt", "a", "--ckpt", "b", "--max_tokens", "32",
                                      "--out", str(tmp_path / "v.md"), "--thinking", "off"])
    assert result.exit_code == 0, result.output
    assert [(str(p), c, h) for p, c, h in asked] == [("p.yaml", ["a", "b"], {"max_tokens": 32, "temperature": 0.0,
                                                                               "out": tmp_path / "v.md", "thinking": "off"})]
    missing = CliRunner().invoke(app, ["vibe", "p.yaml"])
    assert missing.exit_code == 2 and "--ckpt" in missing.output

    pulled: list = []
    monkeypatch.setattr(pull, "pull_suite", lambda suite, to, tasks: pulled.append((suite, to, tasks)))
    for tasks in (["--tasks", "ifeval,gsm8k"], ["--task", "ifeval", "--task", "gsm8k"]):
        assert CliRunner().invoke(app, ["data", "pull", "quick", *tasks]).exit_code == 0
    assert pulled == [("quick", None, ["ifeval", "gsm8k"])] * 2


@pytest.mark.spawn
def test_help_and_compare_load_nothing_heavy():
    """`rufus-eval --help`, `suite --help` and compare build their options without lm-eval or torch."""
    code = ("import sys, rufus_eval.cli, rufus_eval.compare; "
            "print(sorted(m for m in ('lm_eval', 'torch', 'transformers', 'datasets', 'duckdb') if m in sys.modules))")
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert loaded == "[]"
