"""The benchmark registry (catalogs/benchmarks.yaml): which eval sets exist, where their rows
come from (a local file, a copy under $RUFUS_DATA_ROOT, or a pinned hub revision), which
fields hold the problem and the answer, and how the eval suites' tasks map onto them.
decontam loads eval items through here."""

from __future__ import annotations

import difflib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from pydantic import Field, ValidationError, field_validator

from rufus_data.errors import RufusError
from rufus_data.hub import warn_if_unpinned
from rufus_data.jsonl import read_jsonl
from rufus_data.paths import data_root
from rufus_data.yaml_config import StrictModel

DEFAULT_REGISTRY = Path(__file__).resolve().parents[1] / "catalogs" / "benchmarks.yaml"


class HubSource(StrictModel):
    id: str
    config: str | None = None
    split: str
    revision: str


class BenchmarkSpec(StrictModel):
    description: str = ""
    hub: HubSource | None = None
    local: str | None = None  # relative to $RUFUS_DATA_ROOT
    path: str | None = None  # a file of your own; relative to the registry file
    id_field: str | list[str] | None = None  # None: the 0-based row index
    # items with the same value here are one family (GSM-Plus: the perturbations of one seed
    # question); the eval-side boilerplate rule counts families, not items
    group_field: str | None = None
    # keep only rows whose integer id (`id_field`) lies in [first, last]: for a local file that
    # holds more than the hub split (MBPP sanitized: all 427 rows; split test = task ids 11-510)
    id_range: list[int] | None = None
    problem_fields: list[str]
    answer_fields: list[str] = Field(default_factory=list)

    @field_validator("problem_fields")
    @classmethod
    def _some_problem(cls, value: list[str]) -> list[str]:
        if not value:
            raise ValueError("problem_fields must name at least one field")
        return value

    @field_validator("id_range")
    @classmethod
    def _two_ends(cls, value: list[int] | None) -> list[int] | None:
        if value is not None and (len(value) != 2 or value[0] > value[1]):
            raise ValueError("id_range must be [first, last] with first <= last")
        return value


class Registry(StrictModel):
    version: int = 1
    benchmarks: dict[str, BenchmarkSpec]
    sets: dict[str, list[str]] = Field(default_factory=dict)
    # eval-suite task name -> the benchmarks that hold its items (a task named like a benchmark
    # maps to it without an entry here); used by `--against-suite`
    suite_tasks: dict[str, list[str]] = Field(default_factory=dict)
    # eval-suite task name -> why it cannot be checked (no problem text here); reported, not skipped silently
    not_decontaminable: dict[str, str] = Field(default_factory=dict)


@dataclass(frozen=True)
class EvalItem:
    """One eval example: its stable id, the problem texts and the answer texts."""

    benchmark: str
    item_id: str
    problems: tuple[str, ...]
    answers: tuple[str, ...] = ()
    group: str = ""  # its family within the benchmark (`group_field`); "" = the item alone


@dataclass
class LoadedBenchmarks:
    items: list[EvalItem]
    sources: dict[str, dict]  # name -> {"from": ..., "fingerprint": ..., "rows": ...}
    missing: dict[str, str] = field(default_factory=dict)  # name -> why (with --skip-missing)
    not_decontaminable: dict[str, str] = field(default_factory=dict)  # suite/task -> why (--against-suite)


def _nearest(word: str, choices) -> str:
    close = difflib.get_close_matches(word, list(choices), n=1)
    return f" (did you mean `{close[0]}`?)" if close else ""


def load_registry(path: str | Path | None = None) -> tuple[Registry, Path]:
    """Read and strictly validate the registry; an unknown key names itself and the nearest valid one."""
    path = Path(path) if path else DEFAULT_REGISTRY
    if not path.exists():
        raise RufusError(f"benchmark registry {path} does not exist: pass --benchmarks FILE (see catalogs/benchmarks.yaml)")
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        raise RufusError(f"benchmark registry {path} is not valid YAML: {err}") from None
    try:
        registry = Registry.model_validate(raw)
    except ValidationError as err:
        errors = err.errors()
        first = next((e for e in errors if e["type"] == "extra_forbidden"), errors[0])  # a typo explains the rest
        loc = ".".join(str(p) for p in first["loc"])
        hint = ""
        if first["type"] == "extra_forbidden":
            key = str(first["loc"][-1])
            model = {1: Registry, 3: BenchmarkSpec, 4: HubSource}.get(len(first["loc"]), BenchmarkSpec)
            hint = _nearest(key, model.model_fields)
        raise RufusError(f"benchmark registry {path}: `{loc}`: {first['msg']}{hint}") from None
    for set_name, members in registry.sets.items():
        for member in members:
            if member not in registry.benchmarks:
                raise RufusError(f"benchmark registry {path}: set `{set_name}` names unknown benchmark `{member}`"
                                 f"{_nearest(member, registry.benchmarks)}")
    for task, members in registry.suite_tasks.items():
        for member in members:
            if member not in registry.benchmarks:
                raise RufusError(f"benchmark registry {path}: suite_tasks `{task}` names unknown benchmark `{member}`"
                                 f"{_nearest(member, registry.benchmarks)}")
    both = sorted(set(registry.suite_tasks) & set(registry.not_decontaminable))
    if both:
        raise RufusError(f"benchmark registry {path}: task `{both[0]}` is under both suite_tasks and not_decontaminable; "
                         "keep one")
    return registry, path


def resolve_suite(registry: Registry, suite: str, registry_path: Path | None = None) -> tuple[list[str], dict[str, str]]:
    """The benchmarks of an eval suite's tasks (catalogs/suites/NAME.yaml, or a suite YAML path),
    and the tasks that cannot be checked, each with its reason. A task the registry knows
    nothing about is an error: it must be mapped or declared not decontaminable."""
    from rufus_eval.suite import load_suite

    loaded = load_suite(suite)
    names: list[str] = []
    not_checked: dict[str, str] = {}
    where = registry_path or DEFAULT_REGISTRY
    for task in loaded.tasks:
        if task.name in registry.suite_tasks:
            members = registry.suite_tasks[task.name]
        elif task.name in registry.not_decontaminable:
            not_checked[f"{loaded.name}/{task.name}"] = registry.not_decontaminable[task.name]
            continue
        elif task.name in registry.benchmarks:
            members = [task.name]
        else:
            raise RufusError(
                f"suite `{loaded.name}` task `{task.name}` has no benchmark in {where}: map it under `suite_tasks:` "
                f"({task.name}: [BENCHMARK]) or, if it has no problem text to check, list it under "
                f"`not_decontaminable:` with the reason")
        names += [m for m in members if m not in names]
    return names, not_checked


def resolve_names(registry: Registry, against: list[str], registry_path: Path | None = None) -> list[str]:
    """Expand benchmark and set names (in the order given, without repeats)."""
    if not against:
        raise RufusError("no benchmarks to check against: pass --against NAME (a benchmark or a set, e.g. quick) "
                         "or --against-suite SUITE")
    names: list[str] = []
    for name in against:
        members = registry.sets.get(name) or ([name] if name in registry.benchmarks else None)
        if members is None:
            known = sorted(registry.benchmarks) + sorted(registry.sets)
            raise RufusError(f"unknown benchmark or set `{name}` in --against{_nearest(name, known)}; "
                             f"known: {', '.join(known)} (registry {registry_path or DEFAULT_REGISTRY})")
        names += [m for m in members if m not in names]
    return names


def _read_rows(path: Path) -> list[dict]:
    suffix = path.suffix.lower()
    if suffix == ".jsonl":
        return list(read_jsonl(path, "benchmark file"))
    if suffix == ".json":
        data = json.loads(path.read_text(encoding="utf-8"))
        return data if isinstance(data, list) else data.get("data", [])
    if suffix == ".parquet":
        import pyarrow.parquet as pq

        return pq.read_table(path).to_pylist()
    raise RufusError(f"{path}: benchmark files must be .jsonl, .json or .parquet")


def _locate(name: str, spec: BenchmarkSpec, registry_path: Path) -> tuple[list[dict], dict]:
    """Rows of one benchmark and where they came from; RufusError if none of its sources works."""
    from rufus_data.shards import file_sha256

    tried = []
    if spec.path:
        path = Path(spec.path)
        path = path if path.is_absolute() else registry_path.parent / path
        if not path.exists():
            raise RufusError(f"benchmark `{name}`: path {path} (from {registry_path}) does not exist")
        return _read_rows(path), {"from": str(path), "fingerprint": f"sha256:{file_sha256(path)}"}
    root = data_root(required=False)
    if spec.local:
        if root is not None and (root / spec.local).exists():
            path = root / spec.local
            return _read_rows(path), {"from": str(path), "fingerprint": f"sha256:{file_sha256(path)}"}
        tried.append(f"$RUFUS_DATA_ROOT/{spec.local}" + (" (RUFUS_DATA_ROOT is not set)" if root is None else " (not there)"))
    if spec.hub and os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes"):
        tried.append(f"hub {spec.hub.id}@{spec.hub.revision} (HF_HUB_OFFLINE is set)")
    elif spec.hub:
        hub = spec.hub
        warn_if_unpinned(f"benchmark `{name}`", hub.id, hub.revision, "its items can change when the dataset does",
                         f" in {registry_path.name}")
        try:
            import datasets

            ds = datasets.load_dataset(hub.id, hub.config, split=hub.split, revision=hub.revision)
            return ds.to_list(), {"from": f"hub:{hub.id}", "fingerprint": f"revision:{hub.revision}"}
        except Exception as err:  # noqa: BLE001 -- no hub access, gated repo, bad revision: all end the same way
            tried.append(f"hub {hub.id} ({hub.config or 'default'}/{hub.split}@{hub.revision}): "
                         f"{type(err).__name__}: {str(err).splitlines()[0][:160] if str(err) else ''}")
    where = f"$RUFUS_DATA_ROOT/{spec.local}" if spec.local else "a local file"
    raise RufusError(
        f"benchmark `{name}` could not be loaded; tried: {'; '.join(tried) or 'no source declared'}. "
        f"Point it at a local copy: put the file at {where}, or set `path:` for `{name}` in a copy of "
        f"{registry_path.name} and pass it with --benchmarks; or pass --skip-missing to go on without it "
        f"(the report lists it)")


def _item_id(name: str, spec: BenchmarkSpec, row: dict, index: int) -> str:
    if spec.id_field is None:
        return str(index)
    keys = [spec.id_field] if isinstance(spec.id_field, str) else spec.id_field
    missing = [k for k in keys if k not in row]
    if missing:
        raise RufusError(f"benchmark `{name}` row {index}: id field {missing[0]!r} is missing "
                         f"(fields seen: {', '.join(sorted(row))}); fix `id_field` in the registry")
    return "/".join(str(row[k]) for k in keys)


def _texts(value) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return [value] if value.strip() else []
    if isinstance(value, list):
        return [t for v in value for t in _texts(v)]
    return [str(value)]


def load_benchmarks(against: list[str], registry_file: str | Path | None = None,
                    skip_missing: bool = False, suites: list[str] = ()) -> LoadedBenchmarks:
    """Eval items of every benchmark named (sets expanded) and of every eval suite's tasks. A
    benchmark that cannot be loaded is an error, unless `skip_missing`, which records it in
    `missing` instead; suite tasks with nothing to check are listed in `not_decontaminable`."""
    registry, path = load_registry(registry_file)
    names = resolve_names(registry, against, path) if against or not suites else []
    not_checked: dict[str, str] = {}
    for suite in suites:
        members, skipped = resolve_suite(registry, suite, path)
        names += [m for m in members if m not in names]
        not_checked.update(skipped)
    items: list[EvalItem] = []
    sources: dict[str, dict] = {}
    missing: dict[str, str] = {}
    for name in names:
        spec = registry.benchmarks[name]
        try:
            rows, source = _locate(name, spec, path)
        except RufusError as err:
            if not skip_missing:
                raise
            missing[name] = str(err)
            continue
        _check_fields(name, spec, rows, source, path)
        if spec.id_range:
            first, last = spec.id_range
            rows = [r for r in rows if first <= int(r[spec.id_field]) <= last]
        seen: set[str] = set()
        for index, row in enumerate(rows):
            item_id = _item_id(name, spec, row, index)
            if item_id in seen:
                raise RufusError(f"benchmark `{name}`: eval item id {item_id!r} repeats (row {index}); "
                                 f"choose a unique `id_field` or leave it null for row indices")
            seen.add(item_id)
            problems = tuple(t for f in spec.problem_fields for t in _texts(row.get(f)))
            answers = tuple(t for f in spec.answer_fields for t in _texts(row.get(f)))
            family = row.get(spec.group_field) if spec.group_field else None
            group = "" if family is None else str(family)  # no family: the item stands alone
            if problems:
                items.append(EvalItem(name, item_id, problems, answers, group))
        # how the rows were read is part of the fingerprint: the same file with other fields is another index
        sources[name] = {**source, "rows": len(rows), "spec": spec.model_dump(exclude={"description"}, exclude_none=True)}
    return LoadedBenchmarks(items, sources, missing, not_checked)


def _check_fields(name: str, spec: BenchmarkSpec, rows: list[dict], source: dict, path: Path) -> None:
    """Every field the registry names must be in the rows: a typo is an error, never an empty check."""
    if not rows:
        return
    ids = [] if spec.id_field is None else [spec.id_field] if isinstance(spec.id_field, str) else spec.id_field
    for key, fields in (("problem_fields", spec.problem_fields), ("answer_fields", spec.answer_fields),
                        ("id_field", ids), ("group_field", [spec.group_field] if spec.group_field else [])):
        absent = [f for f in fields if f not in rows[0]]
        if absent:
            raise RufusError(f"benchmark `{name}` ({source['from']}): {key.removesuffix('s')} "
                             f"{absent[0]!r} is not in its rows (fields seen: {', '.join(sorted(rows[0]))}); "
                             f"fix `{key}` in {path}")
    if spec.id_range:
        if len(ids) != 1:
            raise RufusError(f"benchmark `{name}`: id_range needs a single integer `id_field`; fix it in {path}")
        bad = next((r[ids[0]] for r in rows if not isinstance(r.get(ids[0]), int)), None)
        if bad is not None:
            raise RufusError(f"benchmark `{name}` ({source['from']}): id_range needs integer ids, "
                             f"but `{ids[0]}` is {bad!r}; fix `id_range` in {path}")
