"""The benchmark registry (catalogs/benchmarks.yaml): the one list of eval sets. It says where each
set's rows come from (a local file, a copy under $RUFUS_DATA_ROOT, or a pinned hub revision,
loaded by rufus_data.dataset_source like every catalog source; BFCL: a PyPI wheel), which fields
hold the problem and the answer, and which conversion rufus-eval applies to hub rows. Eval suites
name these benchmarks (`benchmark:` per task); decontam checks training data against them, and
`--against-suite` reads a suite's task -> benchmark names from its YAML (rufus_data never imports
rufus_eval)."""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from pydantic import Field, ValidationError, field_validator, model_validator

from rufus_data.dataset_source import (
    DatasetSource,
    DatasetUnavailable,
    HubDataset,
    IdRange,
    LoadedRows,
    load_rows,
)
from rufus_data.errors import RufusError
from rufus_data.yaml_config import StrictModel, read_yaml

CATALOGS = Path(__file__).resolve().parents[1] / "catalogs"
DEFAULT_REGISTRY = CATALOGS / "benchmarks.yaml"
SUITES_DIR = CATALOGS / "suites"


class Haystack(StrictModel):
    """A file an lm-eval task downloads while it runs (RULER's haystacks): where Rufus keeps a copy
    (`local`, under $RUFUS_DATA_ROOT) and where `rufus-eval data pull` gets it (`url` or `hub`)."""

    local: str
    url: str | None = None
    hub: HubDataset | None = None


class BenchmarkSpec(DatasetSource):
    """One eval set: where it loads from (`path`, relative to the registry file; `local`, under
    $RUFUS_DATA_ROOT; `hub` at a pinned revision: rufus_data.dataset_source; or `wheel` +
    `category`: the data files a PyPI wheel ships) and its fields."""

    description: str = ""
    id_field: str | list[str] | None = None  # None: the 0-based row index
    # items with the same value here are one family (GSM-Plus: the perturbations of one seed
    # question); the eval-side boilerplate rule counts families, not items
    group_field: str | None = None
    # keep only rows whose integer id (`id_field`) lies in [first, last]: for a local file that
    # holds more than the hub split (MBPP sanitized: all 427 rows; split test = task ids 11-510)
    id_range: list[int] | None = None
    problem_fields: list[str] = Field(default_factory=list)
    answer_fields: list[str] = Field(default_factory=list)
    # the conversion rufus-eval applies to the rows (rufus_eval/convert.py): test cases decoded,
    # choices shuffled, prompts built; a converted local copy passes through unchanged
    convert: str | None = None
    gated: bool = False  # the hub repo asks each user to accept its terms: HF_TOKEN of an account that did
    wheel: str | None = None  # pip requirement of a wheel whose data files are the rows (BFCL)
    category: str | None = None  # the test category inside that wheel, e.g. simple_python
    haystacks: dict[str, Haystack] = Field(default_factory=dict)  # files an lm-eval task fetches while it runs
    # why decontam cannot check this set (no fixed problem text); reported, never skipped silently
    not_decontaminable: str | None = None

    @model_validator(mode="after")
    def _checkable(self) -> BenchmarkSpec:
        if not self.problem_fields and not self.not_decontaminable:
            raise ValueError("problem_fields must name at least one field (or say why the set has none under "
                             "`not_decontaminable:`)")
        if self.wheel and not self.category:
            raise ValueError("a wheel benchmark needs `category` (e.g. simple_python)")
        return self

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
    not_decontaminable: dict[str, str] = field(default_factory=dict)  # suite/task (or benchmark) -> why


def _nearest(word: str, choices) -> str:
    close = difflib.get_close_matches(word, list(choices), n=1)
    return f" (did you mean `{close[0]}`?)" if close else ""


def load_registry(path: str | Path | None = None) -> tuple[Registry, Path]:
    """Read and strictly validate the registry; an unknown key names itself and the nearest valid one."""
    path = Path(path) if path else DEFAULT_REGISTRY
    if not path.exists():
        raise RufusError(f"benchmark registry {path} does not exist: pass --benchmarks FILE (see catalogs/benchmarks.yaml)")
    try:
        # libyaml's parser where PyYAML has it: read by every decontam command, 15x faster than pure Python
        raw = yaml.load(path.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
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
            model = {1: Registry, 3: BenchmarkSpec, 4: HubDataset}.get(len(first["loc"]), BenchmarkSpec)
            hint = _nearest(key, model.model_fields)
        raise RufusError(f"benchmark registry {path}: `{loc}`: {first['msg']}{hint}") from None
    for set_name, members in registry.sets.items():
        for member in members:
            if member not in registry.benchmarks:
                raise RufusError(f"benchmark registry {path}: set `{set_name}` names unknown benchmark `{member}`"
                                 f"{_nearest(member, registry.benchmarks)}")
    return registry, path


def suite_path(name: str) -> Path:
    """A suite name from catalogs/suites/, or a path to a suite YAML."""
    path = Path(name)
    if path.suffix in (".yaml", ".yml") or path.exists():
        return path
    found = SUITES_DIR / f"{name}.yaml"
    if not found.exists():
        known = sorted(p.stem for p in SUITES_DIR.glob("*.yaml"))
        raise RufusError(f"no suite named {name!r}: known suites are {known}, or give a path to a suite YAML")
    return found


def suite_benchmarks(suite: str) -> tuple[str, list[tuple[str, str | None]]]:
    """(suite name, [(task, the benchmark it names or None)]) read from the suite YAML itself: what
    decontam needs, without the eval package (which validates the rest when it runs the suite)."""
    path = suite_path(suite)
    data, _ = read_yaml(path)
    tasks = data.get("tasks") if isinstance(data, dict) else None
    if not isinstance(tasks, list) or not all(isinstance(t, dict) and t.get("name") for t in tasks):
        raise RufusError(f"suite {path}: expected `tasks:`, a list of tasks each with a `name` (see catalogs/suites/)")
    return str(data.get("name") or path.stem), [(str(t["name"]), t.get("benchmark")) for t in tasks]


def resolve_suite(registry: Registry, suite: str, registry_path: Path | None = None) -> tuple[list[str], dict[str, str]]:
    """The benchmarks an eval suite's tasks name (catalogs/suites/NAME.yaml, or a suite YAML path),
    and the tasks that cannot be checked, each with its reason. A task that names no registry
    benchmark (and is not named like one) is an error: decontam would otherwise pass it unchecked."""
    suite_name, tasks = suite_benchmarks(suite)
    names: list[str] = []
    not_checked: dict[str, str] = {}
    where = registry_path or DEFAULT_REGISTRY
    for task, benchmark in tasks:
        benchmark = benchmark or (task if task in registry.benchmarks else None)
        if benchmark is None:
            raise RufusError(
                f"suite `{suite_name}` task `{task}` names no benchmark of {where}: give it `benchmark: NAME` (an "
                f"entry of the registry; a set with no problem text to check says why under `not_decontaminable:`)")
        if benchmark not in registry.benchmarks:
            raise RufusError(f"suite `{suite_name}` task `{task}` names unknown benchmark `{benchmark}`"
                             f"{_nearest(benchmark, registry.benchmarks)}; add it to {where}")
        reason = registry.benchmarks[benchmark].not_decontaminable
        if reason:
            not_checked[f"{suite_name}/{task}"] = reason
        elif benchmark not in names:
            names.append(benchmark)
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


def locate(name: str, spec: BenchmarkSpec, registry_path: Path = DEFAULT_REGISTRY, what: str | None = None) -> LoadedRows:
    """The rows of one benchmark (its `id_range` applied) and where they came from, through the shared
    loader: `path`, then `local`, then `hub`. DatasetUnavailable (naming every place tried) when none loads;
    `what` names the reader in messages (default: the benchmark)."""
    if spec.wheel:
        raise RufusError(f"benchmark `{name}` comes from the wheel {spec.wheel}: rufus-eval reads it (rufus_eval/bfcl.py)")
    source = spec
    if spec.id_range:
        if not isinstance(spec.id_field, str):
            raise RufusError(f"benchmark `{name}`: id_range needs a single integer `id_field`; fix it in {registry_path}")
        source = spec.model_copy(update={"ids": IdRange(field=spec.id_field, within=[tuple(spec.id_range)])})
    return load_rows(source, what or f"benchmark `{name}`", base=registry_path.parent,
                     pin_hint=f" in {registry_path.name}")


def _decontam_rows(name: str, spec: BenchmarkSpec, registry_path: Path) -> tuple[list[dict], dict]:
    try:
        loaded = locate(name, spec, registry_path)
    except DatasetUnavailable as err:
        raise RufusError(
            f"{err}. To use a copy of your own, set `path:` for `{name}` in a copy of {registry_path.name} and pass "
            "it with --benchmarks; `rufus-eval data pull SUITE --to DIR` fetches every set a suite names into a "
            "folder to use as RUFUS_DATA_ROOT; or pass --skip-missing to go on without it (the report lists it)") from None
    return list(loaded.rows), loaded.provenance


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
        if spec.not_decontaminable:  # named with --against (or in a set): said, never checked silently
            not_checked[name] = spec.not_decontaminable
            continue
        try:
            rows, source = _decontam_rows(name, spec, path)
        except RufusError as err:
            if not skip_missing:
                raise
            missing[name] = str(err)
            continue
        _check_fields(name, spec, rows, source, path)
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
