"""What `rufus-train stage NAME --help` shows after the command's options: every key of the
stage (nested ones dotted, `lora.r`), with its type, its default as the stage's YAML resolves
it, and its description, the way `trl sft --help` lists every field of SFTConfig; then the TRL
config class the `trainer:` block takes, and the TRL fields Rufus sets from keys of its own.
Imported only for that help: it loads the stage registry, hence TRL."""

from __future__ import annotations

import types
import typing
from typing import Any, Literal

import yaml
from pydantic import BaseModel
from rich.console import Console, Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from rufus_data.base.errors import RufusError

NO_DESCRIPTION = "(no description)"
# The TRL CLI command whose --help lists a config class's fields with their help (trl/cli/commands).
TRL_COMMANDS = {"SFTConfig": "sft", "DPOConfig": "dpo", "GRPOConfig": "grpo", "KTOConfig": "kto",
                "DistillationConfig": "distillation"}


def type_name(annotation: Any) -> str:
    """A field's type as a reader writes it: `int | null`, `auto | bfloat16`, `list[str]`."""
    if annotation is type(None):
        return "null"
    if annotation is Any:
        return "any"
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is Literal:
        return " | ".join(str(a) for a in args)
    if origin in (typing.Union, types.UnionType):
        return " | ".join(type_name(a) for a in args)
    if origin is list:
        return f"list[{type_name(args[0])}]" if args else "list"
    if origin is dict:
        return "mapping"
    return getattr(annotation, "__name__", str(annotation))


def nested_model(annotation: Any) -> type[BaseModel] | None:
    """The settings model a field holds (`lora: LoraSettings`, `eval: X | None`), if it holds one."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        models = [a for a in typing.get_args(annotation) if isinstance(a, type) and issubclass(a, BaseModel)]
        return models[0] if len(models) == 1 else None
    return None


def shown(value: Any) -> str:
    """A default as the YAML writes it: `null`, `true`, `[q_proj, k_proj]`, `{warmup_steps: 0.03}`."""
    if isinstance(value, str):
        return value
    return yaml.safe_dump(value, default_flow_style=True, width=10_000).strip().removesuffix("...").strip()


def key_rows(model: type[BaseModel], values: dict, prefix: str = "") -> list[tuple[str, str, str, str]]:
    """(key, type, default, description) of every field of `model`, nested models' fields dotted."""
    rows = []
    for name, info in model.model_fields.items():
        if not prefix and name == "stage":
            continue  # the command's NAME
        inner = nested_model(info.annotation)
        value = values.get(name) if isinstance(values, dict) else None
        if inner is not None and isinstance(value, dict):
            rows += key_rows(inner, value, f"{prefix}{name}.")
            continue
        rows.append((prefix + name, type_name(info.annotation), shown(value), info.description or NO_DESCRIPTION))
    return rows


def resolved_defaults(name: str, config_cls) -> tuple[Any, str]:
    """The stage's config as catalogs/stages/NAME.yaml resolves it, and a line saying so; the
    model's own defaults where that file does not load (a broken user copy, an unset ${VAR})."""
    from rufus_train.config_loading import load_stage_config, stage_file

    try:
        return load_stage_config(name, config_cls, notes=[]), f"defaults: {stage_file(name)}, resolved"
    except RufusError as err:
        return config_cls.model_construct(stage=name), f"defaults: the config model's ({err})"


def trl_names(trl_class: type) -> tuple[str, str | None]:
    """(how the class is imported, the TRL class it extends when it is not TRL's own)."""
    import trl

    own = next(c for c in trl_class.__mro__ if c.__module__.split(".")[0] == "trl")
    public = f"trl.{own.__name__}" if getattr(trl, own.__name__, None) is own else f"{own.__module__}.{own.__name__}"
    if own is trl_class:
        return public, None
    return f"{trl_class.__module__}.{trl_class.__name__}", public


def trainer_lines(config) -> list[str]:
    """What `trainer.*` takes, how to list it, and the TRL fields Rufus sets from its own keys."""
    import trl

    from rufus_train.config import trl_config_class
    from rufus_train.trl_keys import managed_fields, trl_fields

    trl_class = trl_config_class(type(config))
    name, extends = trl_names(trl_class)
    base = (extends or name).rpartition(".")[2]
    lister = (f"`trl {TRL_COMMANDS[base]} --help`" if base in TRL_COMMANDS
              else f"`python -c \"from {trl_class.__module__} import {trl_class.__name__}; help({trl_class.__name__})\"`")
    fields = trl_fields(trl_class)
    try:
        managed = managed_fields(config)
    except Exception:  # noqa: BLE001 - a half-built fallback config; the help still lists the keys
        managed = {}
    by_key: dict[str, list[str]] = {}
    for field, how in managed.items():
        if field in fields and how.key != field:
            by_key.setdefault(how.key or "set by Rufus itself", []).append(field)
    owned = "; ".join(f"{', '.join(sorted(fs))} -> {key}" for key, fs in sorted(by_key.items()))
    version = f"extends {extends}, TRL {trl.__version__}" if extends else f"TRL {trl.__version__}"
    takes = (f"trainer.*: any field of {name} ({version}) that "
             f"Rufus does not set, e.g. --trainer.warmup_steps 0.1; {lister} lists them with their help.")
    routed = ("A TRL key written at the top level (--warmup_steps 0.1, or in the stage YAML) is taken as "
              f"trainer.KEY; one Rufus sets itself is refused with the key to use: {owned}.")
    return [takes, routed]


def stage_keys_help(name: str) -> Group:
    """The key table and the `trainer.*` lines of stage `name` (unknown names: RufusError)."""
    from rufus_train.stages import get_stage

    config_cls = get_stage(name).config_class
    config, source = resolved_defaults(name, config_cls)
    table = Table(box=None, header_style="bold", pad_edge=False, expand=True, caption=source, caption_justify="left")
    table.add_column("key", style="bold cyan", no_wrap=True)
    table.add_column("type", style="yellow", overflow="fold", max_width=18)
    table.add_column("default", overflow="fold", max_width=22)
    table.add_column("description", overflow="fold", ratio=1)
    for row in key_rows(config_cls, config.model_dump(mode="json")):
        table.add_row(*(Text(cell) for cell in row))  # text, never markup: `[none]` is a value
    title = f"Keys of stage {name} (--key value, --lora.r 8; a boolean: --KEY, --no_KEY)"
    panel = Panel(table, title=title, title_align="left", border_style="dim")
    trainer = Text("\n".join(trainer_lines(config)))
    return Group(panel, Panel(trainer, title="trainer.*", title_align="left", border_style="dim"))


def print_stage_keys(name: str) -> None:
    Console().print(stage_keys_help(name))
