"""Decontam's view of the benchmarks: every eval item (its id, problem and answer texts) of the
benchmarks and suites named, with where each set was read from. The items come from the rows eval
scores (rows.py: converted, BFCL's from its wheel), so what is checked is what is evaluated."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from rufus_data.base.errors import RufusError
from rufus_data.benchmarks.against import resolve_against
from rufus_data.benchmarks.registry import BenchmarkSpec, load_registry
from rufus_data.benchmarks.rows import benchmark_rows, row_ids
from rufus_data.sources.dataset_source import DatasetUnavailable


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
    suites: list[str] = field(default_factory=list)  # the eval suites whose tasks were resolved


def _decontam_rows(name: str, registry_path: Path) -> tuple[list[dict], dict]:
    """The benchmark's rows as eval reads them (converted; BFCL's from its wheel), or why not, with what to do."""
    try:
        return benchmark_rows(name, registry_file=registry_path)
    except DatasetUnavailable as err:
        raise RufusError(
            f"{str(err).rstrip('.')}. To use a copy of your own, set `path:` for `{name}` in a copy of {registry_path.name} and pass "
            "it with --benchmarks; `rufus-eval data pull SUITE --to DIR` fetches every set a suite names into a "
            "folder to use as RUFUS_DATA_ROOT; or pass --skip-missing to go on without it (the report lists it)") from None


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
    """Eval items of every benchmark `against` names (benchmarks, sets, eval suites: against.py) and
    of every eval suite in `suites`. A benchmark that cannot be loaded is an error, unless
    `skip_missing`, which records it in `missing` instead; what has nothing to check is listed in
    `not_decontaminable`."""
    registry, path = load_registry(registry_file)
    resolved = resolve_against(registry, against, suites, path)
    not_checked = dict(resolved.not_checked)
    items: list[EvalItem] = []
    sources: dict[str, dict] = {}
    missing: dict[str, str] = {}
    for name in resolved.benchmarks:
        spec = registry.benchmarks[name]
        if spec.not_decontaminable:  # a benchmark or set member named: said, never checked silently
            not_checked[name] = spec.not_decontaminable
            continue
        try:
            rows, source = _decontam_rows(name, path)
        except RufusError as err:
            if not skip_missing:
                raise
            missing[name] = str(err)
            continue
        _check_fields(name, spec, rows, source, path)
        for row, item_id in zip(rows, row_ids(name, spec, rows)):
            problems = tuple(t for f in spec.problem_fields for t in _texts(row.get(f)))
            answers = tuple(t for f in spec.answer_fields for t in _texts(row.get(f)))
            family = row.get(spec.group_field) if spec.group_field else None
            group = "" if family is None else str(family)  # no family: the item stands alone
            if problems:
                items.append(EvalItem(name, item_id, problems, answers, group))
        # how the rows were read is part of the fingerprint: the same file with other fields is another index
        sources[name] = {**source, "rows": len(rows), "spec": spec.model_dump(exclude={"description"}, exclude_none=True)}
    return LoadedBenchmarks(items, sources, missing, not_checked, resolved.suites)


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
