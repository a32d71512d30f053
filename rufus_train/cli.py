"""`rufus-train`: stage trainers on curated shards (TRL + peft)."""

from __future__ import annotations

import typer

from rufus_data.console import cli_errors, not_yet

app = typer.Typer(no_args_is_help=True, add_completion=False, help="Rufus training stages on curated shards.")



@app.callback()
def main() -> None:
    """Keep subcommands explicit even while there is only one."""

@app.command("stage")
@cli_errors
def stage(name: str) -> None:
    """Run one post-training stage from catalogs/stages/NAME.yaml."""
    not_yet("rufus-train stage", "the training-stages issue")
