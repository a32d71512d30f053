"""What `rufus-train stage NAME --help` shows after the command's options: every key of the
stage (nested ones dotted, `lora.r`), with its type, its default as the stage's YAML resolves
it, and its description, the way `trl sft --help` lists every field of SFTConfig; then the TRL
config class the `trainer:` block takes, and the TRL fields Rufus sets from keys of its own.
Imported only for that help: it loads the stage registry, hence TRL."""

from __future__ import annotations

import ast
import importlib.metadata
import importlib.util
import types
import typing
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel
from rich.console import Console, Group
from rich.padding import Padding
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


def trl_names(trl_config: str) -> tuple[str, str | None]:
    """(the class a stage's `trl_config` path names, the TRL class it extends when it is not TRL's
    own), read without importing it: TRL's config classes import torch (about 10 s, the whole of
    `stage NAME --help` otherwise). A Rufus subclass's base is read from its module's source."""
    module, _, name = trl_config.rpartition(".")
    if module.split(".")[0] == "trl":
        return trl_config, None
    spec = importlib.util.find_spec(module)
    tree = ast.parse(Path(spec.origin).read_text())
    imported = {alias.asname or alias.name: f"{node.module}.{alias.name}" for node in ast.walk(tree)
                if isinstance(node, ast.ImportFrom) and node.module for alias in node.names}
    cls = next(node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == name)
    base = ast.unparse(cls.bases[0])
    return trl_config, imported.get(base, base)


def trainer_lines(config) -> list[str]:
    """What `trainer.*` takes, how to list it, and the TRL fields Rufus sets from its own keys."""
    from rufus_train.trl_keys import managed_fields

    name, extends = trl_names(type(config).trl_config)
    base = (extends or name).rpartition(".")[2]
    module, _, short = name.rpartition(".")
    lister = (f"`trl {TRL_COMMANDS[base]} --help`" if base in TRL_COMMANDS
              else f"`python -c \"from {module} import {short}; help({short})\"`")
    try:
        managed = managed_fields(config)
    except Exception:  # noqa: BLE001 - a half-built fallback config; the help still lists the keys
        managed = {}
    by_key: dict[str, list[str]] = {}
    for field, how in managed.items():
        if how.key != field:
            by_key.setdefault(how.key or "set by Rufus itself", []).append(field)
    owned = "; ".join(f"{', '.join(sorted(fs))} -> {key}" for key, fs in sorted(by_key.items()))
    trl_version = importlib.metadata.version("trl")
    version = f"extends {extends}, TRL {trl_version}" if extends else f"TRL {trl_version}"
    takes = (f"trainer.*: any field of {name} ({version}) that "
             f"Rufus does not set, e.g. --trainer.warmup_steps 0.1; {lister} lists them with their help.")
    routed = ("A TRL key written at the top level (--warmup_steps 0.1, or in the stage YAML) is taken as "
              f"trainer.KEY; one Rufus sets itself is refused with the key to use: {owned}.")
    return [takes, routed]


# Below this many columns the keys are listed one block each (key, type and default on one line,
# the description wrapped beneath), as argparse and `trl sft --help` do; above, as a table.
TABLE_WIDTH = 120
KEYS_HINT = "--key value (--lora.r 8); a boolean: --KEY, --no_KEY"


def key_table(rows: list[tuple[str, str, str, str]], source: str) -> Table:
    table = Table(box=None, header_style="bold", pad_edge=False, expand=True, caption=source, caption_justify="left")
    table.add_column("key", style="bold cyan", no_wrap=True)
    table.add_column("type", style="yellow", overflow="fold", max_width=18)
    table.add_column("default", overflow="fold", max_width=22)
    table.add_column("description", overflow="fold", ratio=1)
    for row in rows:
        table.add_row(*(Text(cell) for cell in row))  # text, never markup: `[none]` is a value
    return table


def key_blocks(rows: list[tuple[str, str, str, str]], source: str) -> Group:
    """One block per key for a narrow terminal: `--lora.r  int  (default: 4)`, then the description."""
    blocks = []
    for key, kind, default, description in rows:
        head = Text.assemble((f"--{key}", "bold cyan"), "  ", (kind, "yellow"), f"  (default: {default})")
        blocks += [head, Padding(Text(description), (0, 0, 0, 4))]
    return Group(*blocks, Text(source, style="dim"))


def stage_keys_help(name: str, width: int) -> Group:
    """The keys and the `trainer.*` lines of stage `name` for a terminal `width` wide (unknown names: RufusError)."""
    from rufus_train.stages import get_stage

    config_cls = get_stage(name).config_class
    config, source = resolved_defaults(name, config_cls)
    rows = key_rows(config_cls, config.model_dump(mode="json"))
    keys = key_table(rows, source) if width >= TABLE_WIDTH else key_blocks(rows, source)
    panel = Panel(Group(Text(KEYS_HINT, style="dim"), keys), title=f"Keys of stage {name}", title_align="left",
                  border_style="dim")
    trainer = Text("\n".join(trainer_lines(config)))
    return Group(panel, Panel(trainer, title="trainer.*", title_align="left", border_style="dim"))


def print_stage_keys(name: str) -> None:
    console = Console()
    console.print(stage_keys_help(name, console.width))
