"""Every command of a typer app, for the tests that check all of a CLI's commands at once."""

from __future__ import annotations

from collections.abc import Iterator

from typer.main import get_command


def leaf_commands(app, group=None, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], object]]:
    """(command path, click command) of every command of `app`, groups' subcommands included."""
    group = group or get_command(app)
    for name, command in group.commands.items():
        if hasattr(command, "commands"):
            yield from leaf_commands(app, command, (*path, name))
        else:
            yield (*path, name), command
