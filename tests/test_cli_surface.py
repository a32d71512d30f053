"""The command-line surface of the three CLIs, walked command by command: every option and argument
has a help line, every option parses in both spellings (`--max-tokens`, `--max_tokens`) while
--help shows the CLI's own, choices are listed in --help and checked, no boolean flag is required,
list options read as values rather than Python types, and every `--dry-run` loads no model and
writes nothing (tests/test_cli_dry_runs.py runs each one). Nothing here loads a model."""

from __future__ import annotations

import re
import typing

import pytest
import typer
from typer.core import TyperGroup
from typer.main import get_command
from typer.testing import CliRunner

from rufus_data.base.cli_options import HYPHENS, UNDERSCORES, respell
from rufus_data.cli import app as data_app
from rufus_eval.cli import app as eval_app
from rufus_train.cli import app as train_app

CLIS = {"rufus-data": (data_app, HYPHENS), "rufus-eval": (eval_app, HYPHENS), "rufus-train": (train_app, UNDERSCORES)}
# options click and typer add to every command or group themselves
BUILT_IN = {"--help", "--install-completion", "--show-completion"}


def walk(group, path: tuple[str, ...] = ()):
    """(path, command) of every command below a click group, groups' own callbacks left out."""
    for name, command in sorted(group.commands.items()):
        if isinstance(command, TyperGroup):
            yield from walk(command, (*path, name))
        else:
            yield (*path, name), command


COMMANDS = [(cli, path, command) for cli, (app, _) in CLIS.items() for path, command in walk(get_command(app))]
IDS = [f"{cli} {' '.join(path)}" for cli, path, _ in COMMANDS]


def options_of(command) -> list:
    return [p for p in command.params if p.param_type_name == "option" and not set(p.opts) & BUILT_IN]


def choices_of(param) -> list[str]:
    """The values a parameter is limited to (typer 0.29 describes a parameter's type itself)."""
    described = param.type_descriptor
    if described.is_choice and described.choices:
        return [str(c) for c in described.choices]
    return [str(c) for c in getattr(described.parameter_info.parser, "choices", ())]  # a list of choices


def dummy(param) -> str:
    """A value the parameter's type accepts: a choice, a number, or text."""
    if choices_of(param):
        return choices_of(param)[0]
    annotation = param.type_descriptor.annotation
    for inner in (annotation, *typing.get_args(annotation)):
        if inner in (int, float):
            return {int: "1", float: "0.5"}[inner]
    return "x"


def required_args(command) -> list[str]:
    """What a command needs before any option parses: its required arguments and options."""
    args = []
    for param in command.params:
        if param.param_type_name == "argument" and param.required:
            args += [dummy(param)] * (param.nargs if param.nargs > 0 else 1)
        elif param.param_type_name == "option" and param.required and not param.is_flag:
            args += [param.opts[0], dummy(param)]
    return args


def parses(command, args: list[str]) -> dict:
    """The values a command would run with (its callback is not called), or the parse error."""
    ctx = command.make_context(command.name, list(args))
    assert ctx.args == [], f"{args} left {ctx.args} unparsed"
    return ctx.params


@pytest.mark.parametrize(("cli", "path", "command"), COMMANDS, ids=IDS)
def test_every_parameter_has_a_help_line(cli, path, command):
    missing = [p.name for p in command.params if not (getattr(p, "help", None) or "").strip()
               and not set(getattr(p, "opts", ())) & BUILT_IN]
    assert missing == [], f"{cli} {' '.join(path)}: no help for {missing}"
    assert (command.help or command.short_help or "").strip(), f"{cli} {' '.join(path)} has no description"


@pytest.mark.parametrize(("cli", "path", "command"), COMMANDS, ids=IDS)
def test_every_option_in_the_clis_spelling_and_both_parse(cli, path, command):
    spelling = CLIS[cli][1]
    other = UNDERSCORES if spelling == HYPHENS else HYPHENS
    base = required_args(command)
    for param in options_of(command):
        for name in (*param.opts, *param.secondary_opts):
            if name.startswith("--"):
                assert name == respell(name, spelling), f"{cli} {' '.join(path)}: {name} is not in the CLI's spelling"
        flag = param.opts[0]
        value = [] if param.is_flag else [dummy(param)]
        for written in (flag, respell(flag, other)):
            params = parses(command, [*base, written, *value])
            assert param.name in params, f"{cli} {' '.join(path)}: {written} did not parse"


@pytest.mark.parametrize(("cli", "path", "command"), COMMANDS, ids=IDS)
def test_choices_are_listed_and_checked_and_no_flag_is_required(cli, path, command):
    app = CLIS[cli][0]
    shown = CliRunner().invoke(app, [*path, "--help"], env={"COLUMNS": "400"})
    assert shown.exit_code == 0, shown.output
    text = " ".join(shown.output.replace("│", " ").split())
    for param in command.params:
        assert not (getattr(param, "is_flag", False) and param.required), f"{param.name}: a required boolean flag"
        choices = choices_of(param)
        if choices and param.param_type_name == "option":
            assert "|".join(choices) in text, f"{cli} {' '.join(path)}: choices of {param.name} not listed"
            with pytest.raises(Exception, match=r"is not one of|invalid choice"):
                parses(command, [*required_args(command), param.opts[0], "no-such-choice"])
    assert not re.search(r"<(list|dict|tuple)\[", text), f"{cli} {' '.join(path)} shows a Python type: {text}"
    for param in options_of(command):
        if param.type_descriptor.is_list:
            assert (param.metavar or "").endswith("..."), f"{cli} {' '.join(path)}: {param.opts} reads {param.metavar!r}"


def groups(group, path: tuple[str, ...] = ()):
    """(path, group) of a CLI's root and every command group below it."""
    yield path, group
    for name, command in sorted(group.commands.items()):
        if isinstance(command, TyperGroup):
            yield from groups(command, (*path, name))


@pytest.mark.parametrize("cli", list(CLIS))
def test_every_groups_own_options_have_help(cli):
    """`--version` and the like: the root's and each group's own options say what they do too."""
    for path, group in groups(get_command(CLIS[cli][0])):
        missing = [p.name for p in options_of(group) if not (p.help or "").strip()]
        assert missing == [], f"{cli} {' '.join(path)}: no help for {missing}"


def test_the_walk_covers_every_command():
    """The counts the closing note quotes, and a floor so a broken walk cannot pass empty."""
    per_cli = {cli: sum(1 for c, _, _ in COMMANDS if c == cli) for cli in CLIS}
    options = sum(len(options_of(command)) for _, _, command in COMMANDS)
    print(f"commands per CLI {per_cli}; {len(COMMANDS)} commands, {options} options")
    assert per_cli["rufus-data"] >= 15 and per_cli["rufus-eval"] >= 6 and per_cli["rufus-train"] >= 8
    names = {(cli, path) for cli, path, _ in COMMANDS}
    assert {("rufus-data", ("mix",)), ("rufus-data", ("models", "list")), ("rufus-eval", ("suite",)),
            ("rufus-train", ("stage",))} <= names


def test_the_spelling_check_can_fail():
    demo = typer.Typer()

    @demo.command("a")
    def a(max_tokens: int = typer.Option(1, "--max-tokens", help="h")) -> None:
        pass

    @demo.command("b")
    def b() -> None:
        """B."""

    command = get_command(demo).commands["a"]  # a plain typer command: one spelling only
    assert parses(command, ["--max-tokens", "2"])["max_tokens"] == 2
    with pytest.raises(Exception, match="No such option"):
        parses(command, ["--max_tokens", "2"])
