"""`rufus-data`: thin typer commands over the library functions (tests call those directly)."""

from __future__ import annotations

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
