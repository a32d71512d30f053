"""`rufus-data`: thin typer commands over the library functions (tests call those directly)."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.table import Table

from rufus_data.console import cli_errors, console

app = typer.Typer(no_args_is_help=True, add_completion=False, help="Rufus data: sources, mix, decontam, filter, pairs.")
models_app = typer.Typer(no_args_is_help=True, help="Model references and the built-in small model.")
app.add_typer(models_app, name="models")


@app.callback()
def main() -> None:
    """Keep subcommands explicit even while there is only one."""


@models_app.command("list")
@cli_errors
def models_list() -> None:
    """List the built-in models and whether they are converted in the cache."""
    from rufus_data.models import list_models

    table = Table(title="built-in models")
    for col in ("name", "cached", "path", "source", "description"):
        table.add_column(col)
    for row in list_models():
        table.add_row(*(str(row[c]) for c in ("name", "cached", "path", "source", "description")))
    console.print(table)


@models_app.command("pull")
@cli_errors
def models_pull(name: str = typer.Argument("smollm2-135m", help="built-in model name")) -> None:
    """Download, check and convert a built-in model into the cache ($RUFUS_CACHE)."""
    from rufus_data.models import pull

    console.print(f"{name}: {pull(name)}")


@app.command("mix")
@cli_errors
def mix_command(
    catalog: Path = typer.Argument(..., help="mixture catalog (YAML), e.g. catalogs/sft.yaml"),
    out: Path = typer.Option(None, "--out", help="output folder (default: outputs/<catalog name>)"),
    overwrite: bool = typer.Option(False, "--overwrite", help="replace an existing output folder"),
    holdout: int = typer.Option(None, "--holdout", help="rows per source held out (overrides the catalog)"),
    on_bad_row: str = typer.Option("error", "--on-bad-row", help="error | skip rows that lack required fields"),
) -> None:
    """Mix sources by token share into parquet shards with a manifest and a report."""
    from rufus_data.errors import RufusError
    from rufus_data.mix import mix

    if on_bad_row not in ("error", "skip"):
        raise RufusError(f"--on-bad-row must be 'error' or 'skip', not {on_bad_row!r}")
    result = mix(catalog, out=out, overwrite=overwrite, holdout=holdout, on_bad_row=on_bad_row)
    console.print(f"wrote {result.out} ({result.manifest['rows']['train']:,} rows): see {result.out / 'report.md'}")


@app.command("inspect")
@cli_errors
def inspect_command(
    folder: Path = typer.Argument(..., help="shard folder written by rufus-data"),
    as_json: bool = typer.Option(False, "--json", help="print the findings as JSON"),
) -> None:
    """Rows and tokens per source and label, a token-length histogram, and data-bug warnings."""
    from rufus_data.shard_inspect import inspect_shards, to_json

    found = inspect_shards(folder)
    if as_json:
        print(to_json(found))
        return
    table = Table(title=f"{folder}: rows and tokens")
    for col in ("source", "label", "rows", "tokens", "trainable"):
        table.add_column(col, justify="left" if col in ("source", "label") else "right")
    for r in found.per_source:
        table.add_row(r["source"], r["label"], f"{r['rows']:,}", f"{r['tokens'] or 0:,}", f"{r['trainable'] or 0:,}")
    console.print(table)
    if found.histogram:
        peak = max(n for _, _, n in found.histogram)
        console.print("[bold]token length histogram[/]")
        for lo, hi, n in found.histogram:
            console.print(f"{lo:>7,}-{hi:<7,} {'█' * max(1, round(40 * n / peak))} {n:,}", highlight=False)
    for warning in found.warnings:
        console.print(f"[yellow]warning:[/] {warning}")
    if not found.warnings:
        console.print("[green]no data-bug warnings[/]")


@app.command("sql")
@cli_errors
def sql_command(
    folder: Path = typer.Argument(..., help="shard folder"),
    query: str = typer.Argument(..., help="SQL over the views train (alias shards) and holdout"),
) -> None:
    """Run a DuckDB query over a shard folder."""
    from rufus_data.shard_inspect import run_sql

    columns, rows = run_sql(folder, query)
    table = Table()
    for col in columns:
        table.add_column(col)
    for row in rows:
        table.add_row(*(str(v) for v in row))
    console.print(table)
