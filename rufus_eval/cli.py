"""`rufus-eval`: lm-eval suites with avg@k, run comparison, and side-by-side vibe tests."""

from __future__ import annotations

import signal
import sys
from pathlib import Path

import typer

from rufus_data.cli_options import CliApp
from rufus_data.console import cli_errors, console
from rufus_data.generate import BackendConfig
from rufus_eval.compare import compare_runs

app = CliApp(help="Rufus evaluation suites.")


@app.callback()
def main() -> None:
    """Keep subcommands explicit."""


def _exit_on_sigterm() -> None:
    """SIGTERM (the checkpoint callback stopping an evaluation) unwinds normally, so the vLLM
    server this process started is stopped by its `with` block and the launcher's atexit hook."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))


@app.command("suite")
@cli_errors
def suite(
    name: str = typer.Argument(..., help="suite name in catalogs/suites/ or a path to a suite YAML"),
    ckpt: str = typer.Option(..., help="model: folder, checkpoint, built-in name (smollm2-135m), or served name"),
    backend: str = typer.Option("auto", help="auto (vllm when a GPU and vLLM are here, else hf) | hf (in-process) | "
                                "vllm (Rufus starts vLLM) | server"),
    limit: int = typer.Option(None, help="documents per task (quick checks)"),
    out: Path = typer.Option(None, help="run folder (default outputs/eval/<run>)"),
    final: bool = typer.Option(False, "--final", help="also run the test-role tasks"),
    step: int = typer.Option(None, help="training step of the checkpoint (default: N of checkpoint-N, a run folder's "
                             "run.json global_step, else 0 for a base model)"),
    run_name: str = typer.Option(None, "--name", help="run name (default suite-ckpt-time)"),
    base_url: str = typer.Option(None, help="server backend: OpenAI-compatible endpoint"),
    tokenizer: str = typer.Option(None, help="server backend: tokenizer folder (default: --ckpt)"),
    devices: str = typer.Option(None, help="vllm backend: CUDA_VISIBLE_DEVICES of the server, verbatim"),
    data_parallel_size: int = typer.Option(1, help="vllm backend: --data-parallel-size"),
    samples: int = typer.Option(None, help="override every task's k"),
    max_tokens: int = typer.Option(None, help="override every task's max_tokens"),
    task: list[str] = typer.Option(None, "--task", help="run only this task of the suite (repeatable)"),
    db: Path = typer.Option(None, help="DuckDB file of all runs (default $RUFUS_EVAL_DB or outputs/eval/results.duckdb)"),
    strict: bool = typer.Option(False, "--strict", help="a task whose data is not here is an error (default: skipped, "
                                "listed with the command that fetches it)"),
) -> None:
    """Run an evaluation suite from catalogs/suites/NAME.yaml; prints the results table and the run folder."""
    # lm-eval (and torch) load with these, not for `compare` or `vibe`
    from rufus_eval.backends import CONCURRENCY, choose_backend  # heavy: lm-eval and torch load with
    from rufus_eval.runner import RunRequest, run_suite  # these, not for --help, compare or data pull

    _exit_on_sigterm()
    backend, why = choose_backend(backend)
    console.print(f"backend: {backend} ({why})", highlight=False, markup=False, soft_wrap=True)
    cfg = BackendConfig(
        backend=backend, base_urls=[base_url] if base_url else [], tokenizer=tokenizer, devices=devices,
        served_model_name=run_name if backend == "vllm" else None,  # the server Rufus starts carries the run's name
        data_parallel_size=data_parallel_size, concurrency=CONCURRENCY,
    )
    run_suite(RunRequest(
        suite=name, checkpoint=ckpt, backend=cfg, limit=limit, out=out, final=final, step=step,
        run_name=run_name, db_path=db, samples=samples, max_tokens=max_tokens, tasks=task or None, strict=strict,
    ))


data_app = CliApp(help="Benchmark data for offline runs.")
app.add_typer(data_app, name="data")


@data_app.command("pull")
@cli_errors
def data_pull(
    name: str = typer.Argument(..., help="suite name in catalogs/suites/ or a path to a suite YAML"),
    to: Path = typer.Option(None, help="folder laid out like RUFUS_DATA_ROOT (default: $RUFUS_DATA_ROOT)"),
    task: list[str] = typer.Option(None, "--task", help="only this task's data (repeatable)"),
) -> None:
    """Download and convert every task's data of a suite, with a manifest of revisions and sha256s."""
    # the suite model builds reward specs (about 1.7 s of imports), and arrow, httpx and the registry:
    # only when data is pulled, not for --help or compare
    from rufus_data.benchmarks.pull import pull_suite

    pull_suite(name, to, task or None)


@app.command("compare")
@cli_errors
def compare(
    runs: list[str] = typer.Argument(..., help="run folders (or results.json files)"),
    png: Path = typer.Option(None, help="where to write the metric-vs-step plot (default: compare.png beside the first run)"),
) -> None:
    """A table of the runs' metrics across checkpoints (stdout), and a PNG of metric vs step."""
    compare_runs(runs, png)


@app.command("vibe")
@cli_errors
def vibe(
    prompts: Path = typer.Argument(..., help="YAML: a list of prompts (strings or {system, user})"),
    ckpt: list[str] = typer.Option(..., "--ckpt", help="model to ask (give two or more)"),
    max_tokens: int = typer.Option(256),
    temperature: float = typer.Option(0.0),
    out: Path = typer.Option(None, help="also write the answers as Markdown here"),
) -> None:
    """A handful of your own prompts answered side by side by each checkpoint (example: catalogs/vibe_prompts.yaml)."""
    from rufus_eval.vibe import run_vibe  # torch and lm-eval load with it: not for --help or compare

    run_vibe(prompts, ckpt, max_tokens=max_tokens, temperature=temperature, out=out)


if __name__ == "__main__":
    app()
