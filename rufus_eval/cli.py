"""`rufus-eval`: lm-eval suites with avg@k, run comparison, and side-by-side vibe tests."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from pydantic import Field

from rufus_data.base.borrowed_options import borrowed_options
from rufus_data.base.cli_options import (
    DRY_RUN_HELP,
    CliApp,
    Flag,
    FormatOption,
    VersionOption,
    comma_list,
    flag_option,
    model_options,
)
from rufus_data.base.console import cli_errors, exit_on_sigterm, print_rows
from rufus_data.base.env_report import env_command
from rufus_data.base.yaml_config import StrictModel, model_from_options
from rufus_data.models.thinking import THINKING_HELP, ThinkingMode
from rufus_eval.compare import compare_runs
from rufus_eval.lm_eval_spellings import LM_EVAL_SPELLINGS
from rufus_eval.request import EvalRequest, request_from_cli

app = CliApp(help="Rufus evaluation suites.")


@app.callback()
def main(version: VersionOption = False) -> None:
    """Keep subcommands explicit."""


app.command("env")(env_command)


@app.command("suite")
@cli_errors
@borrowed_options(LM_EVAL_SPELLINGS)
@model_options(EvalRequest, optional=("suite", "checkpoint"))  # or both in --request FILE
def suite(
    request: Path = typer.Option(None, "--request", help="a JSON evaluation request (the fields below), or a "
                                 "checkpoint evaluation's eval_logs/step-N/job.json; options given beside it override it"),
    fmt: FormatOption = "table",
    dry_run: Annotated[bool, flag_option("--dry-run", f"{DRY_RUN_HELP}: the tasks to run and to skip (with why and "
                                         "the command that fetches their data), the backend, the resolved request "
                                         "as JSON")] = False,
    options: dict | None = None,
) -> None:
    """Run an evaluation suite from catalogs/suites/NAME.yaml; prints the results table (stdout) and the run
    folder (stderr)."""
    req = request_from_cli(options, request)
    if dry_run:
        from rufus_eval.plan import dry_run as print_plan  # the suite model and the data, not lm-eval

        print_plan(req, fmt)
        return
    from rufus_eval.runner import run_suite  # heavy: lm-eval and torch, not for --help or compare

    exit_on_sigterm()  # the checkpoint callback stops an evaluation this way
    run_suite(req, fmt)


data_app = CliApp(help="Benchmark data for offline runs.")
app.add_typer(data_app, name="data")


class DataPullSettings(StrictModel):
    """What `rufus-eval data pull` fetches, and where to."""

    suite: Annotated[str, Flag(argument=True, metavar="SUITE")] = Field(
        description="suite name in catalogs/suites/ or a path to a suite YAML")
    to: Path | None = Field(None, description="folder laid out like RUFUS_DATA_ROOT (default: $RUFUS_DATA_ROOT)")
    tasks: Annotated[list[str] | None, Flag("--tasks", metavar="TASK", parse=comma_list, aliases=("--task",))] = Field(
        None, description="only these tasks' data: comma-separated (gsm8k,math500) or repeated (default: every task "
        "of the suite, test tasks too)")


@data_app.command("pull")
@cli_errors
@model_options(DataPullSettings)
def data_pull(options: dict | None = None) -> None:
    """Download and convert every task's data of a suite, with a manifest of revisions and sha256s."""
    # the suite model builds reward specs (about 1.7 s of imports), and arrow, httpx and the registry:
    # only when data is pulled, not for --help or compare
    from rufus_data.benchmarks.pull import pull_suite

    settings = model_from_options(DataPullSettings, options)
    pull_suite(settings.suite, settings.to, settings.tasks)


@app.command("compare")
@cli_errors
def compare(
    runs: list[str] = typer.Argument(..., help="run folders (or results.json files)", metavar="RUN"),
    png: Path = typer.Option(None, help="where to write the metric-vs-step plot (default: compare.png beside the first run)"),
    fmt: FormatOption = "table",
) -> None:
    """Two runs over the same documents: per task each run's score ± SE, the paired delta B - A ± SE, a verdict
    (beyond 2 SE or not) and pass@k. More runs: a table of their metrics across checkpoints. Also a PNG of metric vs step."""
    compare_runs(runs, png, fmt)


@app.command("results")
@cli_errors
def results(
    query: str = typer.Argument(None, help="SQL over the table `results`, one row per run and task (default: every "
                                "row's run, step, task, metric, value, stderr, k, docs, status)", metavar="SQL"),
    runs: list[Path] = typer.Option(None, "--runs", help="folder of eval runs, searched at any depth, or a run "
                                    "folder (repeatable; default outputs/eval)", metavar="DIR..."),
    fmt: FormatOption = "table",
) -> None:
    """Query every run's results with DuckDB SQL; the table is read from the runs' results.json when asked."""
    from rufus_eval.results import query_results  # heavy: duckdb and arrow

    print_rows(*query_results(query, runs or None), fmt)


class VibeSettings(StrictModel):
    """What `rufus-eval vibe` asks, of which models, and how they answer."""

    prompts: Annotated[Path, Flag(argument=True, metavar="PROMPTS")] = Field(
        description="YAML: a list of prompts (a string, or {system, user}) or conversations ({system, turns: the user "
        "turns}); example: catalogs/vibe_prompts.yaml")
    checkpoints: Annotated[list[str], Flag("--ckpt", metavar="MODEL")] = Field(
        min_length=1, description="a model to ask: folder, checkpoint, built-in name (smollm2-135m) or hub id; repeat "
        "it to answer side by side")
    max_tokens: int = Field(256, ge=1, description="tokens each reply may take")
    temperature: float = Field(0.0, ge=0, description="sampling temperature (0: greedy decoding, the same reply each "
                               "time)")
    out: Path | None = Field(None, description="also write the answers as Markdown here (the side-by-side page goes "
                             "beside it as OUT.html; vibe.html without --out)")
    thinking: ThinkingMode = Field("default", description=THINKING_HELP)


@app.command("vibe")
@cli_errors
@model_options(VibeSettings)
def vibe(options: dict | None = None) -> None:
    """Your own prompts and multi-turn conversations answered side by side by each checkpoint, each turn's reply
    with its reasoning mode (/think, /no_think)."""
    settings = model_from_options(VibeSettings, options)
    from rufus_eval.vibe import run_vibe  # torch and lm-eval load with it: not for --help or compare

    run_vibe(settings.prompts, settings.checkpoints, max_tokens=settings.max_tokens, temperature=settings.temperature,
             out=settings.out, thinking=settings.thinking)


if __name__ == "__main__":
    app()
