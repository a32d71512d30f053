"""What `rufus-data decontam --against NAME` and `--against-suite SUITE` name: benchmarks, sets of
the registry, and the benchmarks an eval suite's tasks name."""

from __future__ import annotations

from pathlib import Path

from rufus_data.benchmarks.registry import DEFAULT_REGISTRY, Registry, nearest
from rufus_data.benchmarks.suite import suite_path
from rufus_data.errors import RufusError
from rufus_data.yaml_config import read_yaml


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
                             f"{nearest(benchmark, registry.benchmarks)}; add it to {where}")
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
            raise RufusError(f"unknown benchmark or set `{name}` in --against{nearest(name, known)}; "
                             f"known: {', '.join(known)} (registry {registry_path or DEFAULT_REGISTRY})")
        names += [m for m in members if m not in names]
    return names
