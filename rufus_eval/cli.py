"""`rufus-eval`: lm-eval suites with avg@k and checkpoint evaluation."""

from __future__ import annotations

import typer

from rufus_data.console import cli_errors, not_yet

app = typer.Typer(no_args_is_help=True, add_completion=False, help="Rufus evaluation suites.")



@app.callback()
def main() -> None:
    """Keep subcommands explicit even while there is only one."""

@app.command("suite")
@cli_errors
def suite(name: str, ckpt: str = typer.Option(..., help="model reference")) -> None:
    """Run an evaluation suite from catalogs/suites/NAME.yaml."""
    not_yet("rufus-eval suite", "the evaluation issue")
