"""What decontam's `--against NAME` names: a benchmark of the registry, a set of them (`sets:`;
`all` is every benchmark), or an eval suite (catalogs/suites/NAME.yaml, or a suite YAML path),
read through the suite schema (suite.py): its tasks name their benchmarks, so what is checked is
what the suite scores. `--against-suite NAME` takes suites only. What cannot be checked (a set
with no fixed problem text, a task whose data is inline in its suite) is listed with the reason,
never left out silently."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from rufus_data.base.errors import RufusError
from rufus_data.benchmarks.registry import ALL, Registry, default_registry, nearest
from rufus_data.benchmarks.suite import find_suite, known_suites, load_suite, task_benchmark


@dataclass
class Against:
    benchmarks: list[str] = field(default_factory=list)  # in the order named, without repeats
    suites: list[str] = field(default_factory=list)  # the suites named, as given
    not_checked: dict[str, str] = field(default_factory=dict)  # suite/task -> why it cannot be checked

    def add(self, names: list[str]) -> None:
        self.benchmarks += [n for n in names if n not in self.benchmarks]


def resolve_against(registry: Registry, against: list[str], suites: list[str] = (),
                    registry_path: Path | None = None) -> Against:
    """Expand the names given with --against (benchmarks, sets, suites) and --against-suite (suites)."""
    if not against and not suites:
        raise RufusError("no benchmarks to check against: pass --against NAME (a benchmark, a set or an eval suite, "
                         "e.g. quick or smollm3)")
    registry_path = registry_path or default_registry()
    resolved = Against()
    for name in against:
        if name in registry.benchmarks:
            resolved.add([name])
        elif name == ALL:
            resolved.add(list(registry.benchmarks))
        elif (path := find_suite(name)) is not None:
            if name in registry.sets:
                raise RufusError(f"`{name}` is both a set of {registry_path} and the eval suite {path}: --against "
                                 f"{name} checks the suite's tasks; remove the set `{name}` from the registry")
            _add_suite(registry, name, registry_path, resolved)
        elif name in registry.sets:
            resolved.add(registry.sets[name])
        else:
            known = sorted(registry.benchmarks) + sorted(registry.sets) + [ALL]
            raise RufusError(f"unknown benchmark or set `{name}` in --against{nearest(name, known + known_suites())}, "
                             f"and no eval suite of that name: known benchmarks and sets: {', '.join(known)} "
                             f"(registry {registry_path}); suites: {', '.join(known_suites())} (or a suite YAML path)")
    for name in suites:
        _add_suite(registry, name, registry_path, resolved)
    return resolved


def _add_suite(registry: Registry, name: str, registry_path: Path, resolved: Against) -> None:
    """The benchmarks a suite's tasks name. A task that names no registry benchmark (and is not named
    like one) is an error: decontam would otherwise pass it unchecked."""
    suite = load_suite(name, registry_path)
    resolved.suites.append(name)
    for task in suite.tasks:
        where = f"{suite.name}/{task.name}"
        if task.data is not None:
            resolved.not_checked[where] = "its data is inline in the suite (`data:`), not a benchmark of the registry"
            continue
        benchmark = task_benchmark(task, registry)
        if benchmark is None:
            raise RufusError(
                f"suite `{suite.name}` task `{task.name}` names no benchmark of {registry_path}: give it `benchmark: "
                f"NAME` (an entry of the registry; a set with no problem text to check says why under "
                f"`not_decontaminable:`)")
        reason = registry.benchmarks[benchmark].not_decontaminable
        if reason:
            resolved.not_checked[where] = reason
        else:
            resolved.add([benchmark])
