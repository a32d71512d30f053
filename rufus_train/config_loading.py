"""A stage config from its YAML (catalogs/stages/NAME.yaml or --config FILE) and the command
line (`--key value`, CLI wins, as TRL's CLI does), validated into its schema (config.py), and
the resolved config as the YAML `--dry-run` prints and every run folder keeps. TRL keys written
outside `trainer:` are taken into it (trl_keys.py); `trainer:` is checked against the TRL config."""

from __future__ import annotations

import dataclasses
import difflib
import os
import types
import typing
from collections.abc import Collection
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ValidationError

from rufus_data.base.borrowed_options import taken_note
from rufus_data.base.catalog_files import catalog_file, resolve_entry
from rufus_data.base.console import console
from rufus_data.base.errors import RufusError
from rufus_data.base.redaction import redact
from rufus_data.base.yaml_config import (
    format_validation_error,
    load_yaml_text,
    node_line,
    override_key,
    read_yaml,
)
from rufus_train.config import StageConfig, trl_config_class
from rufus_train.trl_keys import (
    TakenKey,
    managed_fields,
    near_trl_keys,
    take_from_mapping,
    take_from_overrides,
    take_from_pairs,
    trl_field_type,
    trl_fields,
)


def stage_file(name: str) -> Path:
    """catalogs/stages/NAME.yaml: the user's own, else the shipped one (catalog_files.py)."""
    return catalog_file(f"stages/{name}.yaml", "stage config")


def parse_cli_overrides(args: list[str]) -> list[tuple[str, str | None]]:
    """`--key value`, `--key=value` and bare `--flag` (true) into (dotted key, raw value) pairs."""
    pairs: list[tuple[str, str | None]] = []
    i = 0
    while i < len(args):
        arg = args[i]
        if not arg.startswith("--") or len(arg) == 2:
            raise RufusError(f"unexpected argument {arg!r}: overrides are written `--key value` (e.g. --max_steps 10)")
        key = arg[2:]
        if "=" in key:
            key, value = key.split("=", 1)
            pairs.append((key.replace("-", "_"), value))
            i += 1
            continue
        if i + 1 < len(args) and not args[i + 1].startswith("--"):
            pairs.append((key.replace("-", "_"), args[i + 1]))
            i += 2
        else:
            pairs.append((key.replace("-", "_"), None))
            i += 1
    return pairs


def _is_str_type(annotation: Any) -> bool:
    """True when a raw CLI string should stay a string (str, or Optional[str], or a Literal of str)."""
    if annotation is str:
        return True
    origin = typing.get_origin(annotation)
    if origin is Literal:
        return all(isinstance(a, str) for a in typing.get_args(annotation))
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        return len(args) == 1 and _is_str_type(args[0])
    return False


def _field_annotation(model: type[BaseModel], parts: list[str]) -> Any:
    current: Any = model
    for part in parts:
        fields = getattr(current, "model_fields", None)
        if not fields or part not in fields:
            return None
        current = fields[part].annotation
    return current


def typed_value(config_cls: type[StageConfig], dotted: str, raw: str | None) -> Any:
    """Type a CLI value by the model: strings stay strings, everything else is read as YAML."""
    if raw is None:
        return True
    parts = dotted.split(".")
    if parts[0] == "trainer" and len(parts) == 2:
        annotation = trl_field_type(trl_config_class(config_cls), parts[1])
    else:
        annotation = _field_annotation(config_cls, parts)
    if _is_str_type(annotation):
        return raw
    try:
        return load_yaml_text(raw, f"--{dotted}")
    except RufusError:
        return raw


def typed_override(config_cls: type[StageConfig], dotted: str, raw: str | None) -> tuple[str, Any]:
    """(key, typed value) of one command-line override. Boolean keys are flags, as in rufus-data:
    `--KEY` sets one true, `--no-KEY` false (`--no-lora.enabled` or `--lora.no-enabled` for a
    nested one); `--KEY true|false` still works."""
    if raw is None:
        head, _, last = dotted.rpartition(".")
        negated = [dotted[3:]] if dotted.startswith("no_") else []
        negated += [f"{head}.{last[3:]}" if head else last[3:]] if last.startswith("no_") else []
        for positive in negated:
            if _field_annotation(config_cls, positive.split(".")) in (bool, bool | None):
                return positive, False
    return dotted, typed_value(config_cls, dotted, raw)


def apply_overrides(data: dict, overrides: dict[str, Any]) -> dict:
    """Set dotted keys (`lora.r`, `trainer.warmup_steps`) in a copy of `data`; CLI wins."""
    data = {k: (dict(v) if isinstance(v, dict) else v) for k, v in data.items()}
    for dotted, value in overrides.items():
        parts = dotted.split(".")
        target = data
        for part in parts[:-1]:
            if not isinstance(target.get(part), dict):
                target[part] = {}
            target = target[part]
        target[parts[-1]] = value
    return data


def check_trainer_block(
    config: StageConfig, path: Path | str, overrides: Collection[str] = (), overrides_from: str = "command line --{key}",
    taken: dict[str, TakenKey] | None = None,
) -> None:
    """Every `trainer:` key must be a field of the TRL config and not one Rufus sets itself
    (trl_keys.managed_fields); each problem names where the key was written: the file, the
    override's source, or where a TRL key `taken` into `trainer:` stood."""
    cls = trl_config_class(type(config))
    valid = sorted(f.name for f in dataclasses.fields(cls))
    managed = managed_fields(config)
    taken = taken or {}
    problems = []
    for key in config.trainer:
        given = override_key(f"trainer.{key}", overrides)
        where = taken[key].where if key in taken else overrides_from.format(key=given) if given else str(path)
        if key not in valid:
            close = difflib.get_close_matches(key, valid, n=1)
            hint = f"; did you mean '{close[0]}'?" if close else ""
            problems.append(f"{where}: unknown key 'trainer.{key}' for {cls.__name__}{hint}")
        elif key in managed and key in taken:
            problems.append(f"{where}: '{taken[key].written}' is a field of {cls.__name__} that Rufus sets itself: "
                            f"{managed[key].instead(type(config))}")
        elif key in managed:
            problems.append(f"{where}: 'trainer.{key}' is set by Rufus: {managed[key].instead(type(config))}")
    if problems:
        raise RufusError("; ".join(problems))


def take_trl_spellings(config_cls: type[StageConfig], mapping: dict, where_of) -> tuple[dict, dict[str, Any], list[str]]:
    """A stage YAML's or pipeline entry's TRL spellings (`model_name_or_path:`, `use_peft:`) read with
    the table and note the command line uses (trl_spellings.py): the mapping without them, the
    dotted keys they set, and the notes; `where_of(key)` names where each was written."""
    from rufus_train.trl_spellings import TRL_SPELLINGS

    table = {entry.name[2:]: entry for entry in TRL_SPELLINGS}
    kept, taken, notes = dict(mapping), {}, []
    for key in [k for k in mapping if isinstance(k, str) and k.replace("-", "_") in table]:
        entry, value, where = table[key.replace("-", "_")], kept.pop(key), where_of(key)
        try:
            rufus = entry.translate(_spelled_value(value))
        except RufusError as err:
            raise RufusError(f"{where}: {err}") from None
        for dotted, typed in (typed_override(config_cls, k, v) for k, v in parse_cli_overrides(rufus)):
            if _holds(kept, dotted) or dotted in taken:
                raise RufusError(f"{where}: {key} is TRL's spelling of {dotted}, which is written too: keep one")
            taken[dotted] = typed
        notes.append("note: " + taken_note(entry, where if where.endswith(key) else f"{where}: {key}", rufus))
    return kept, taken, notes


def _spellings_taken(config_cls, data: dict, path: Path, node, overrides, overrides_from: str):
    """The stage YAML and a pipeline's stage entry (dict overrides) with their TRL spellings taken,
    and the notes saying so (a command line's were taken before typer parsed it)."""
    data, spelt, said = take_trl_spellings(config_cls, data, lambda key: f"{path}:{node_line(node, (key,))}")
    data = apply_overrides(data, spelt)
    if isinstance(overrides, dict):
        overrides, spelt, of_entry = take_trl_spellings(config_cls, overrides, lambda key: overrides_from.format(key=key))
        overrides, said = {**overrides, **spelt}, said + of_entry
    return data, overrides, said


def _spelled_value(value: Any) -> str | None:
    """A YAML value as the command line would have written it (a list as `a,b`, a boolean as true/false)."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return ",".join(map(str, value))
    return str(value)


def _holds(mapping: dict, dotted: str) -> bool:
    """Whether `mapping` sets `dotted`, as a nested key (`lora: {r: 8}`) or a dotted one (`lora.r`)."""
    if dotted in mapping:
        return True
    head, _, rest = dotted.partition(".")
    return bool(rest) and isinstance(mapping.get(head), dict) and _holds(mapping[head], rest)


def mentions_trl(config_cls: type[StageConfig], data: dict, overrides: dict[str, Any]) -> bool:
    """Whether the YAML or the overrides hold a key that is no stage key, or a `trainer:` one: only
    then is the stage's TRL config class imported (it imports torch: about 10 s of `--help` and
    `--dry_run` otherwise)."""
    stage_keys = set(config_cls.model_fields)
    heads = {key.split(".")[0] for key in [*data, *overrides] if isinstance(key, str)}
    unknown = {head for head in heads if head not in stage_keys and head.removeprefix("no_") not in stage_keys}
    return bool(data.get("trainer")) or "trainer" in {key.split(".")[0] for key in overrides} or bool(unknown)


def load_stage_config(
    name: str,
    config_cls: type[StageConfig],
    config_file: str | Path | None = None,
    overrides: dict[str, Any] | list[tuple[str, str | None]] | None = None,
    overrides_from: str = "command line --{key}",
    notes: list[str] | None = None,
) -> StageConfig:
    """YAML (catalogs/stages/NAME.yaml or --config FILE), then CLI overrides, validated strictly.
    An error names where its key was written: the file's line, or `overrides_from` (the command
    line by default; a pipeline names its own file) with the key filled in. A TRL key written
    outside `trainer:` is taken into it (trl_keys.py): the note saying so is printed, or added to
    `notes` when the caller collects them."""
    path = resolve_entry(config_file) if config_file else stage_file(name)
    data, node = read_yaml(path)
    data = data or {}
    if not isinstance(data, dict):
        raise RufusError(f"{path}: the top level must be a mapping of keys, got {type(data).__name__}")
    if data.get("stage", name) != name:
        raise RufusError(f"{path} is a config for stage '{data['stage']}', not '{name}': run `rufus-train stage {data['stage']}`")
    data["stage"] = name
    data, overrides, said = _spellings_taken(config_cls, data, path, node, overrides, overrides_from)
    keys = overrides if isinstance(overrides, dict) else dict(overrides or [])
    trl_class = trl_config_class(config_cls) if mentions_trl(config_cls, data, keys) else None
    fields = trl_fields(trl_class) if trl_class else {}
    taken: dict[str, TakenKey] = {}
    if trl_class:
        data, taken = take_from_mapping(data, config_cls.model_fields, fields,
                                        lambda key: f"{path}:{node_line(node, (key,))}")
    if isinstance(overrides, list):
        if trl_class:
            overrides, from_command_line = take_from_pairs(overrides, config_cls.model_fields, trl_class, overrides_from)
            taken.update(from_command_line)
        overrides = dict(typed_override(config_cls, k, v) for k, v in overrides)
    elif trl_class:
        overrides, from_command_line = take_from_overrides(overrides or {}, config_cls.model_fields, fields,
                                                           overrides_from)
        taken.update(from_command_line)
    data = apply_overrides(data, overrides or {})
    data = _expand_env(data)
    try:
        config = config_cls.model_validate(data)
    except ValidationError as err:
        problems = format_validation_error(err, path, node, config_cls, overrides, overrides_from)
        hints = near_trl_keys(data, config_cls.model_fields, fields)
        raise RufusError(f"invalid {name} config: {problems}{hints}") from None
    if config.trainer:
        check_trainer_block(config, path, overrides, overrides_from, taken)
    said += [taken_key.note(key) for key, taken_key in taken.items()]
    if notes is not None:
        notes.extend(said)
        return config
    for note in said:
        console.print(note, style="yellow", highlight=False, markup=False, soft_wrap=True)
    return config


def _expand_env(value: Any) -> Any:
    """`${VAR}` in strings (shard paths in pipeline and stage files)."""
    if isinstance(value, str):
        expanded = os.path.expandvars(value)
        if "${" in expanded:
            raise RufusError(f"'{value}' names an environment variable that is not set: export it or write the path")
        return expanded
    if isinstance(value, dict):
        return {k: _expand_env(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_expand_env(v) for v in value]
    return value


def resolved_yaml(config: StageConfig) -> str:
    """The resolved config as YAML (what --dry-run prints and every run folder keeps)."""
    return yaml.safe_dump(redact(config.model_dump(mode="json")), sort_keys=False, allow_unicode=True)
