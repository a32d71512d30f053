"""Strict YAML configs: pydantic validation whose errors name the file, the line and the key,
and suggest the nearest valid key. Catalogs, benchmark registries, stages and suites all load
through `load_yaml_model`, and every config model derives from `StrictModel`."""

from __future__ import annotations

import difflib
from collections.abc import Collection
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError

from rufus_data.base.catalog_files import resolve_entry
from rufus_data.base.errors import RufusError

M = TypeVar("M", bound=BaseModel)


class StrictModel(BaseModel):
    """The base of every Rufus config model. Unknown keys are errors (a typo must not be dropped
    silently), and assignments are validated too: catalogs, suites and stage configs are adjusted
    after loading (resolved paths, CLI overrides), and they must stay valid when they are.
    Validators that set a field of their own model use `object.__setattr__` (an assignment there
    would run the validators again). Not frozen, for the same adjustments; not strict, because
    YAML reads `learning_rate: 1e-5` as the text "1e-5" (a field that must not be coerced says so
    itself, as a source's `share` does)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)


def renamed_key(data: Any, old: str, new: str) -> tuple[Any, bool]:
    """(`data` with its key `old` written `new`, whether it had `old`): a config written before a key
    was renamed still reads (a model's `mode="before"` validator calls this, and says so). Both keys
    in one mapping are refused: which one is meant?"""
    if not isinstance(data, dict) or old not in data:
        return data, False
    if new in data:
        raise ValueError(f"`{old}` is the old name of `{new}`: give only `{new}`")
    return {new if key == old else key: value for key, value in data.items()}, True


def config_source(info: Any, default: str) -> str:
    """The file a model is being validated from (`load_yaml_model` passes it as the context's
    `path`), for a validator's message; `default` when it was built otherwise."""
    return str((getattr(info, "context", None) or {}).get("path") or default)


def read_yaml(path: str | Path) -> tuple[Any, yaml.Node | None]:
    """Parse a YAML file; returns (data, node tree for line lookups)."""
    path = Path(path)
    if not path.exists():
        raise RufusError(f"config file {path} does not exist: check the path")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise RufusError(f"{path} is not UTF-8 text ({err}): save it as UTF-8") from None
    return parse_yaml(text, str(path))


MAX_YAML_NODES = 1_000_000  # values of a document with its aliases expanded: a config has thousands
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def parse_yaml(text: str, where: str) -> tuple[Any, yaml.Node | None]:
    """(data, node tree) of YAML `text` read safely, the one way Rufus reads YAML: malformed text,
    or aliases that expand past MAX_YAML_NODES values (a "billion laughs" document) or into
    themselves, is a RufusError naming `where`, before anything is built from it."""
    loader = _LOADER(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None, None
        _check_expansion(node, where)
        return loader.construct_document(node), node
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(err, "problem", None) or str(err)
        raise RufusError(f"{where}: malformed YAML{at}: {problem}. Fix the syntax there and run again") from None
    finally:
        loader.dispose()


def load_yaml_text(text: str, where: str) -> Any:
    """The data of YAML `text` (see `parse_yaml`)."""
    return parse_yaml(text, where)[0]


def _check_expansion(root: yaml.Node, where: str) -> None:
    """Count the values `root` stands for with every alias expanded, each shared node once (linear
    in the document, however far its aliases would expand)."""
    sizes: dict[int, int] = {}
    open_nodes: set[int] = set()

    def size(node: yaml.Node) -> int:
        key = id(node)
        if key in sizes:
            return sizes[key]
        if key in open_nodes:
            raise RufusError(f"{where}: line {node.start_mark.line + 1}: an alias refers to the value that holds "
                             "it (a recursive YAML value): write the value out instead")
        open_nodes.add(key)
        children = node.value if isinstance(node, yaml.SequenceNode) else (
            [n for pair in node.value for n in pair] if isinstance(node, yaml.MappingNode) else [])
        sizes[key] = 1 + sum(size(child) for child in children)
        open_nodes.discard(key)
        return sizes[key]

    try:
        total = size(root)
    except RecursionError:
        raise RufusError(f"{where}: YAML nested too deeply to read: flatten it") from None
    if total > MAX_YAML_NODES:
        raise RufusError(f"{where}: its YAML aliases expand to {total:,} values, more than the {MAX_YAML_NODES:,} "
                         "a Rufus config may hold (a \"billion laughs\" document?): write the values out or "
                         "use fewer aliases")


def node_line(node: yaml.Node | None, loc: tuple) -> int | None:
    """1-based line of the YAML node at `loc` (keys and list indexes), or of its nearest parent."""
    line = node.start_mark.line + 1 if node is not None else None
    for part in loc:
        if isinstance(node, yaml.MappingNode):
            for key_node, value_node in node.value:
                if key_node.value == part:
                    line = key_node.start_mark.line + 1
                    node = value_node
                    break
            else:
                return line
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(node.value):
            node = node.value[part]
            line = node.start_mark.line + 1
        else:
            return line
    return line


def _model_at(model: type[BaseModel], loc: tuple) -> type[BaseModel] | None:
    """The pydantic model class that owns the last key of `loc` (to suggest valid keys)."""
    current: Any = model
    for part in loc[:-1]:
        if isinstance(part, int):
            continue
        fields = getattr(current, "model_fields", None)
        if not fields or part not in fields:
            return None
        annotation = fields[part].annotation
        current = _inner_model(annotation)
        if current is None:
            return None
    return current if isinstance(current, type) and issubclass(current, BaseModel) else None


def _inner_model(annotation: Any) -> Any:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()) or ():
        found = _inner_model(arg)
        if found is not None:
            return found
    return None


def format_validation_error(
    err: ValidationError,
    path: Path,
    node: yaml.Node | None,
    model: type[BaseModel],
    overrides: Collection[str] = (),
    overrides_from: str = "command line --{key}",
) -> str:
    """One clause per error, each naming where the key was written: `path:line`, or for a dotted
    key in `overrides` (set on top of the file) `overrides_from` with the key filled in."""
    lines = []
    for item in err.errors():
        loc = tuple(p for p in item["loc"] if not (isinstance(p, str) and p.startswith("function-")))
        key = ".".join(str(p) for p in loc) or "(top level)"
        line = node_line(node, loc)
        where = f"{path}:{line}" if line else str(path)
        given = override_key(key, overrides)
        if given:
            where = overrides_from.format(key=given)
        if item["type"] == "extra_forbidden":
            owner = _model_at(model, loc)
            valid = sorted(owner.model_fields) if owner else []
            close = difflib.get_close_matches(str(loc[-1]), valid, n=1)
            hint = f"; did you mean '{close[0]}'?" if close else ""
            lines.append(f"{where}: unknown key '{key}'{hint} (valid keys here: {', '.join(valid)})")
        else:
            lines.append(f"{where}: key '{key}': {item['msg']}")
    return "; ".join(lines)


def override_key(dotted: str, overrides: Collection[str]) -> str | None:
    """The override that set `dotted`: itself or a parent (`--lora.rr` sets `lora.rr`)."""
    return next((k for k in overrides if dotted == k or dotted.startswith(k + ".")), None)


def load_yaml_model(path: str | Path, model: type[M], overrides: dict | None = None) -> M:
    """Load and strictly validate a YAML file into `model` (extra keys forbidden by the model)."""
    path = Path(path)
    data, node = read_yaml(path)
    if data is None:
        raise RufusError(f"{path} is empty: it needs the keys of a {model.__name__}")
    if not isinstance(data, dict):
        raise RufusError(f"{path}: the top level must be a mapping of keys, got {type(data).__name__}")
    if overrides:
        data = {**data, **overrides}
    try:
        return model.model_validate(data, context={"path": path})
    except ValidationError as err:
        raise RufusError(f"invalid {model.__name__} in " + format_validation_error(err, path, node, model)) from None


def model_from_options(model: type[M], options: dict) -> M:
    """Validate command-line options into `model`: a bad value is a RufusError naming the option."""
    try:
        return model.model_validate(options)
    except ValidationError as err:
        # an error of one option names it; one of the options together (a model's own check) stands alone
        problems = "; ".join((f"--{'-'.join(str(p) for p in e['loc']).replace('_', '-')}: " if e["loc"] else "")
                             + e["msg"] for e in err.errors())
        raise RufusError(f"invalid option for {model.__name__}: {problems}") from None


def settings_model(model: type[M], settings: M | dict | str | Path | None, where: str = "settings") -> M:
    """A data step's settings from Python as its config model: the model itself, a dict of its
    fields, or a YAML file of them (None: the defaults). A bad key is a RufusError naming it (in
    `where`), as a bad line of a file is."""
    if isinstance(settings, model):
        return settings
    if isinstance(settings, (str, Path)):
        return load_yaml_model(settings, model)
    if settings is not None and not isinstance(settings, dict):
        raise TypeError(f"{where}: a {model.__name__}, a dict of its fields or a YAML path, not {type(settings).__name__}")
    try:
        return model.model_validate(settings or {})
    except ValidationError as err:
        raise RufusError(f"invalid {model.__name__}: " + format_validation_error(err, Path(where), None, model)) from None


def config_from_cli(model: type[M], config_file: str | Path | None, options: dict) -> M:
    """`--config FILE` (if given) with the command-line options on top: options left unset do not
    override the file, and a bad option is named as an option, not as a line of the file."""
    options = {key: value for key, value in options.items() if value is not None}
    config = model_from_options(model, options)
    return load_yaml_model(resolve_entry(config_file), model, options) if config_file else config
