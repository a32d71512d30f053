"""Typer options generated from a pydantic config model: one flag per field, its help the field's
`description`, its default the field's default. A setting is added to the model once and reaches
every command built on it, the way TRL's HfArgumentParser builds flags from its dataclasses.

    @app.command("filter")
    @cli_errors
    @model_options(FilterConfig, optional=("policy", "reward"))
    def filter_command(out: Path = typer.Option(..., "--out"), options: dict = None) -> None:
        config = FilterConfig(**options)

The flag of `max_tokens` is `--max-tokens` in rufus-data and rufus-eval and `--max_tokens` in
rufus-train (each CLI's own style: `CliApp(spelling=...)`), and every command of the three takes
both spellings, as TRL and lm-eval users type them. A boolean is a plain flag (`--overwrite`,
never required); a `Literal` field, or a list of one, shows and checks its choices; a field
without a default is a required option. Where the field name or type does not say how it is written on the command
line, a `Flag` in the field's annotation does: `Annotated[list[str], Flag("--base-url",
metavar="URL")]` (repeatable, shown `URL...`), or `Annotated[str, Flag(argument=True)]` (the
command's positional argument, as `rufus-eval suite NAME`).

Every Rufus CLI is a `CliApp`, whose commands show boolean flags bare in --help."""

from __future__ import annotations

import functools
import inspect
import types
import typing
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Literal

import typer
from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined
from rich.markup import escape
from typer.core import TyperCommand, TyperGroup

from rufus_data.base.borrowed_options import BORROWED_ATTRIBUTE, translate_borrowed
from rufus_data.base.console import console
from rufus_data.base.cpu_threads import cpu_thread_defaults
from rufus_data.base.errors import RufusError, SaidWarning
from rufus_data.base.quiet_bars import quiet_bars_off_a_terminal


@dataclass(frozen=True)
class Flag:
    """How a field is written on the command line, where its name and type do not say it."""

    name: str | None = None  # default: --field-name
    type: Any = None  # the command-line type, when the field's has none in typer (list[str | dict])
    parse: Callable[[Any], Any] | None = None  # command-line value -> field value (shlex.split, ...)
    argument: bool = False  # a positional argument (what the command acts on), not an --option
    metavar: str | None = None  # what --help shows for the value: URL (a list shows URL...)
    aliases: tuple[str, ...] = ()  # other names that parse as this option, unlisted (`--task` for `--tasks`)
    old_names: tuple[str, ...] = ()  # names that still parse, with a note naming this one (a rename)
    renamed_because: str | None = None  # the note's reason for the rename


@dataclass(frozen=True)
class CliField:
    """One generated option: the field it fills and how."""

    field: str
    parse: Callable[[Any], Any] | None
    parameter: inspect.Parameter
    renamed: dict[str, tuple[str, str | None]]  # other names of the option: {name: (option, note or None)}


HYPHENS, UNDERSCORES = "-", "_"  # the two spellings of a long option: --max-tokens, --max_tokens


def respell(option: str, spelling: str) -> str:
    """A long option in one spelling: `--max-tokens` <-> `--max_tokens` (short options as they are)."""
    if not option.startswith("--"):
        return option
    other = UNDERSCORES if spelling == HYPHENS else HYPHENS
    return "--" + option[2:].replace(other, spelling)


def accept_both_spellings(args: list[str], known: set[str], renamed: dict[str, str] | None = None) -> list[str]:
    """`args` with each long option that is not `known` but is in the other spelling written the
    known way (`--max_tokens 8` for a command that declares `--max-tokens`), and each name in
    `renamed` (old or alias, either spelling) written as the option it stands for; values,
    unknown options and everything after a bare `--` as they are."""
    renamed = {respell(old, spelling): new for old, new in (renamed or {}).items() for spelling in (HYPHENS, UNDERSCORES)}
    out: list[str] = []
    for i, arg in enumerate(args):
        if arg == "--":
            return out + args[i:]
        if arg.startswith("--") and len(arg) > 2:
            name, eq, value = arg.partition("=")
            if name not in known:
                name = next((o for o in (respell(name, HYPHENS), respell(name, UNDERSCORES)) if o in known),
                            renamed.get(name, name))
            arg = name + eq + value
        out.append(arg)
    return out


RENAMED_ATTRIBUTE = "rufus_renamed"  # on a command's callback: {old name: (new name, note or None)}


class _RufusCommand:
    """What every Rufus command does with its options: writes each in its CLI's spelling, takes
    the other spelling too, and shows boolean flags bare (typer 0.29 shows `--overwrite <bool>`,
    even `--help <bool>`, which reads as if the flag took a value)."""

    spelling = HYPHENS

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        for param in self.params:
            if param.param_type_name == "option":
                param.opts = [respell(o, self.spelling) for o in param.opts]
                param.secondary_opts = [respell(o, self.spelling) for o in param.secondary_opts]

    def get_params(self, ctx):
        params = super().get_params(ctx)
        for param in params:
            if getattr(param, "is_flag", False) and param.metavar is None:
                param.metavar = ""
            described = getattr(param, "type_descriptor", None)
            shows_type = param.param_type_name == "argument" or param.metavar is None  # an option's metavar replaces it
            if described is not None and described.is_list and not described.is_choice and shows_type:
                param.display_type_rich = functools.partial(_list_type, param)  # <path>..., not <list[Path]>
        return params

    def parse_args(self, ctx, args):
        known = {o for p in self.get_params(ctx) if p.param_type_name == "option" for o in (*p.opts, *p.secondary_opts)}
        renamed = getattr(self.callback, RENAMED_ATTRIBUTE, {})
        for arg in args:
            old = arg.partition("=")[0]
            for name, (new, note) in renamed.items():
                if note and old in (respell(name, HYPHENS), respell(name, UNDERSCORES)):
                    console.print(f"note: {old} is now {respell(new, self.spelling)} ({note}); {old} still works for now",
                                  style="yellow", highlight=False, markup=False, soft_wrap=True)
        names = {old: respell(new, self.spelling) for old, (new, _) in renamed.items()}
        borrowed = getattr(self.callback, BORROWED_ATTRIBUTE, {})
        if borrowed:
            try:
                args = translate_borrowed(list(args), borrowed, _say_note)
            except RufusError as err:  # before the command runs: cli_errors does not see it
                console.print(f"[bold red]error:[/] {escape(str(err))}", highlight=False, soft_wrap=True)
                ctx.exit(2)
        return super().parse_args(ctx, accept_both_spellings(list(args), known, names))


def _say_note(line: str) -> None:
    console.print(line, style="yellow", highlight=False, markup=False, soft_wrap=True)


def _list_type(param, ctx=None) -> str:
    """How --help shows a list parameter's values: its element's type, repeated (`<path>...`)."""
    (element,) = typing.get_args(param.type_descriptor.annotation) or (str,)
    return f"<{param._bare_type(element).lower()}>..."


class FlagCommand(_RufusCommand, TyperCommand):
    """A Rufus command: options in its CLI's spelling (either is accepted), boolean flags bare."""


class FlagGroup(_RufusCommand, TyperGroup):
    """A command group whose --help shows boolean flags bare."""

    def parse_args(self, ctx, args):  # a group's own options are few; its arguments are a command line
        return TyperGroup.parse_args(self, ctx, args)


class CliApp(typer.Typer):
    """The typer app of each Rufus CLI: shell completion (`--install-completion`), help when called bare,
    options written in the CLI's `spelling` (rufus-train as TRL writes them, `--max_steps`; the
    others `--max-tokens`) with the other spelling accepted, boolean flags written and shown one
    way in all three CLIs (`--overwrite`, no value), and, when the program starts, the CPU thread
    defaults (cpu_threads.py), third-party bars off a terminal (quiet_bars.py) and warnings the
    console has already given shown once."""

    def __init__(self, spelling: str = HYPHENS, **options):
        super().__init__(cls=FlagGroup, no_args_is_help=True, add_completion=True, **options)
        self.spelling = spelling
        self.command_class = type("FlagCommand", (FlagCommand,), {"spelling": spelling})

    def __call__(self, *args, **kwargs):
        cpu_thread_defaults()  # before any command imports torch
        quiet_bars_off_a_terminal()  # before any command imports lm-eval or datasets
        warnings.filterwarnings("ignore", category=SaidWarning)  # the console said it
        return super().__call__(*args, **kwargs)

    def add_typer(self, typer_instance: typer.Typer, **options) -> None:
        if isinstance(typer_instance, CliApp) and typer_instance.spelling != self.spelling:
            raise ValueError(f"a {self.spelling!r} CLI's command group must spell its options the same way")
        super().add_typer(typer_instance, **options)

    def command(self, name: str | None = None, *, cls: type[TyperCommand] | None = None, **options):
        if cls is not None and not issubclass(cls, self.command_class):
            raise TypeError(f"{cls.__name__} must derive from the app's command_class (its spelling and flags)")
        return super().command(name, cls=cls or self.command_class, **options)


def flag_option(name: str, help: str, **options) -> Any:
    """A boolean option written as a bare flag, shown without a value (`--overwrite`, not
    `--overwrite <bool>` as typer renders it by default)."""
    return typer.Option(name, help=help, metavar="", **options)


def _print_version(value: bool) -> None:
    if value:
        from rufus_data.base.version import code_version

        typer.echo(code_version().describe())
        raise typer.Exit()


# `--version` of all three CLIs (their callbacks take it): the version every output records.
VersionOption = Annotated[bool, typer.Option(
    "--version", callback=_print_version, is_eager=True, metavar="",
    help="print Rufus's version (with the commit, from a checkout) and exit; `env` prints the whole environment")]

# The options every command that writes a folder spells the same way, in all three CLIs.
OverwriteOption = Annotated[bool, flag_option("--overwrite", "replace an existing output folder")]

# One meaning of --dry-run everywhere: what the command would do, checked and printed, and nothing
# done. Each command's own help says what its plan lists.
DRY_RUN_HELP = ("validate, resolve and print the plan; load no model and no data beyond what the plan needs, "
                "write nothing")
DryRunOption = Annotated[bool, flag_option("--dry-run", DRY_RUN_HELP)]
# The other mode of decontam and dedup, which was their --dry-run before --dry-run meant the plan.
REPORT_ONLY_HELP = ("run every stage and print the summary, write nothing (--out not needed); this was --dry-run "
                    "before --dry-run meant the plan")

# How a command prints a table a script may read (console.print_rows).
OutputFormat = Literal["table", "csv", "json"]
FormatOption = Annotated[OutputFormat, typer.Option(
    "--format", help="table for people; csv or json for files and pipes (every value whole)")]


def comma_list(values: list[str]) -> list[str]:
    """A list option given comma-separated, repeated, or both (`--tasks a,b --tasks c`), as lm-eval
    takes `--tasks a,b`: a `Flag(parse=comma_list)`."""
    return [item.strip() for value in values for item in value.split(",") if item.strip()]


def flag_of(info: FieldInfo) -> Flag:
    return next((m for m in info.metadata if isinstance(m, Flag)), Flag())


def cli_fields(model: type[BaseModel], optional: Sequence[str] = (), layered: bool = False,
               panel: str | None = None) -> list[CliField]:
    """The options of `model`'s fields: the model's own fields first, then those it inherits.
    `optional` fields are never required on the command line (the command checks them itself);
    `layered`: a boolean is `--x/--no-x`, either way over a file (model_options); `panel`: their --help section."""
    fields = model.model_fields
    unknown = set(optional) - set(fields)
    if unknown:
        raise ValueError(f"{model.__name__} has no field {sorted(unknown)}")
    out = []
    for name in _declaration_order(model):
        info = fields[name]
        if not info.description:
            raise ValueError(f"{model.__name__}.{name} has no description: it is the option's help")
        flag = flag_of(info)
        option_name = flag.name or "--" + name.replace("_", "-")
        cli_type = flag.type or _cli_type(info.annotation)
        default = _default(info, name in optional)
        if cli_type is bool and default is ...:
            raise ValueError(f"{model.__name__}.{name} is a required boolean: give it a default (a flag is optional)")
        shown = default not in (None, ...)
        if flag.argument:
            option = typer.Argument(help=info.description, show_default=shown, metavar=flag.metavar,
                                    rich_help_panel=panel)
        elif cli_type is bool:
            both = layered or default
            option = flag_option(f"{option_name}/--no-{option_name[2:]}" if both else option_name, info.description,
                                 rich_help_panel=panel)
        else:
            choices = _list_choices(cli_type)
            option = typer.Option(option_name, help=info.description, show_default=shown, metavar=_metavar(cli_type, flag),
                                  parser=_choice_parser(choices) if choices else None, rich_help_panel=panel)
            cli_type = list[str] if choices else cli_type
        parameter = inspect.Parameter(
            name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=Annotated[cli_type, option]
        )
        renamed = {alias: (option_name, None) for alias in flag.aliases}
        renamed.update({old: (option_name, flag.renamed_because or info.description) for old in flag.old_names})
        out.append(CliField(name, flag.parse, parameter, renamed))
    return out


def model_options(model: type[BaseModel], *, into: str = "options", optional: Sequence[str] = (),
                  layered: bool = False, panel: str | None = None):
    """Decorator: the command gets one option per field of `model` after its own parameters, and
    receives their values as one dict in its parameter `into` (fields left unset are absent).
    Stacked with another `into`, a command takes two models' options (its own settings, a stage's).
    `layered`: the options go on top of a config file (`--config FILE`): only those given on the
    command line are in `into`, so one left out keeps the file's value (--help still shows the
    model's default), and a boolean is `--x/--no-x`, to set it either way over the file. `panel`:
    the --help section the options are listed in."""
    generated = cli_fields(model, optional, layered, panel)
    context_name = f"{into}_context"

    def decorate(command: Callable) -> Callable:
        signature = inspect.signature(command, eval_str=True)
        own = [p for name, p in signature.parameters.items() if name != into]
        clash = {p.name for p in own} & {g.field for g in generated}
        if clash:
            raise ValueError(f"{command.__name__} declares {sorted(clash)} itself and through {model.__name__}")

        @functools.wraps(command)
        def wrapper(*args, **kwargs):
            values = {}
            context = kwargs.pop(context_name, None)
            for item in generated:
                value = kwargs.pop(item.field, None)
                if value is None or (isinstance(value, (list, tuple)) and not value):
                    continue  # unset: the model's default applies
                if context is not None and context.get_parameter_source(item.field).name == "DEFAULT":
                    continue  # not given: a config file under the options keeps its value
                values[item.field] = item.parse(value) if item.parse else value
            return command(*args, **kwargs, **{into: values})

        parameters = own + [g.parameter for g in generated]
        if layered:  # typer passes the context, which says which options were given
            parameters.append(inspect.Parameter(context_name, inspect.Parameter.KEYWORD_ONLY, annotation=typer.Context))
        renamed = {**getattr(command, RENAMED_ATTRIBUTE, {})}
        for item in generated:
            renamed.update(item.renamed)
        setattr(wrapper, RENAMED_ATTRIBUTE, renamed)
        wrapper.__signature__ = signature.replace(parameters=parameters)
        wrapper.__annotations__ = {p.name: p.annotation for p in parameters}
        return wrapper

    return decorate


def _metavar(cli_type: Any, flag: Flag) -> str | None:
    """What --help shows for a value: the Flag's (`URL`), `VALUE...` for a list (one per repeat)
    rather than typer's `<list[str]>`, a list of choices as typer shows one choice
    (`<wandb|trackio>...`); None leaves typer's own (`<int>`, a Literal's choices)."""
    if typing.get_origin(cli_type) is list:
        choices = _list_choices(cli_type)
        return f"{flag.metavar or ('<' + '|'.join(choices) + '>' if choices else 'VALUE')}..."
    return flag.metavar


def _list_choices(cli_type: Any) -> tuple[str, ...]:
    """The choices of a `list[Literal[...]]` (typer takes no list of a Literal: each value is checked
    by a parser instead), else ()."""
    if typing.get_origin(cli_type) is not list:
        return ()
    (item,) = typing.get_args(cli_type) or (None,)
    return tuple(typing.get_args(item)) if typing.get_origin(item) is Literal else ()


def _choice_parser(choices: tuple[str, ...]) -> Callable[[str], str]:
    def choose(value: str) -> str:
        if value not in choices:
            raise typer.BadParameter(f"{value!r} is not one of {', '.join(choices)}")
        return value

    choose.choices = choices  # what it accepts, for whoever inspects the option
    return choose


def _declaration_order(model: type[BaseModel]) -> list[str]:
    """Field names, the most derived class's own first (a command's settings before the shared ones)."""
    order: list[str] = []
    for cls in model.__mro__:
        for name in inspect.get_annotations(cls):
            if name in model.model_fields and name not in order:
                order.append(name)
    return order


def _default(info: FieldInfo, optional: bool) -> Any:
    if info.default is not PydanticUndefined:
        return info.default
    if info.default_factory is not None:
        value = info.default_factory()
        return None if value in ([], {}, ()) else value  # an empty list shows as no default
    return None if optional else ...


def _cli_type(annotation: Any) -> Any:
    """The type typer parses: the annotation, with `X | None` read as X."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(args) == 1:
            return args[0]
        raise TypeError(f"{annotation} has no command-line form: give the field a Flag(type=...)")
    return annotation
