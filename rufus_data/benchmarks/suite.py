"""Suite configs: what a `catalogs/suites/NAME.yaml` may say, validated strictly.

A suite is a list of tasks. Each task says what it is (`kind`):
- `rufus`: Rufus writes the lm-eval task config (local JSON data through `dataset_path: json`),
  samples k answers (`repeats`), strips reasoning and scores every one with a Rufus reward (`scorer`: a
  registry reward spec, as train and filter name rewards);
- `lm_eval`: a task lm-evaluation-harness ships (`lm_eval_task`, `metric_key`), run through a
  config Rufus writes around it so that reasoning is stripped before its own filters score.
Where the data comes from is the benchmark registry's business (catalogs/benchmarks.yaml): a task
names its `benchmark`, loaded path -> local -> hub at the pinned revision and converted by Rufus
(rows.py). A suite of your own may give `data:` inline instead (a dataset source:
`path` relative to the suite file, `local` under $RUFUS_DATA_ROOT, or `hub`).

k is `repeats`, lm-eval's own name for the answers sampled per document; suites written when
it was `samples` (lm-eval's name for picking documents) still read, with a warning naming the
file."""

from __future__ import annotations

import difflib
import re
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationInfo, field_validator, model_serializer, model_validator

from rufus_data.base.catalog_files import catalog_names, find_catalog_file, looked_in, resolve_entry
from rufus_data.base.console import console
from rufus_data.base.errors import RufusError
from rufus_data.base.yaml_config import StrictModel, config_source, load_yaml_model, renamed_key
from rufus_data.benchmarks.registry import Registry, load_registry
from rufus_data.models.thinking import ThinkingMode, yaml_thinking_mode
from rufus_data.rewards.contract import RewardFunction
from rufus_data.rewards.registry import build_reward, parse_spec
from rufus_data.sources.dataset_source import DatasetSource

METRIC_RE = re.compile(r"^(avg|pass|maj)@(k|\d+)$")
REPEATS_RENAMED = ("lm-eval's `samples` picks documents; `repeats` is its name for the answers sampled per document, "
                   "k")


def _say_repeats(where: str, places: list[str]) -> None:
    console.print(f"warning: {where}: `samples` is now `repeats` ({REPEATS_RENAMED}); read as `repeats` "
                  f"({', '.join(places)}): rename it there", style="yellow", highlight=False, markup=False, soft_wrap=True)


class Sampling(StrictModel):
    """Sampling of the k answers; temperature 0 with k > 1 is refused (k equal answers)."""

    temperature: float = Field(0.6, ge=0)
    top_p: float = Field(0.95, gt=0, le=1)
    max_tokens: int = Field(1024, ge=1)


class ScorerSpec(StrictModel):
    """The reward that scores each sample: a registry reward spec (rufus_data/rewards/registry.py), the same
    `string_match:boxed` or `{name: llm_judge, model: ...}` that train and filter take, written as the spec
    itself. The task's gold fields reach the reward as its dataset columns. `name` and `options` are the
    parsed spec; it dumps back to the spec (the lm-eval config the metric reads holds that)."""

    name: str
    options: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _from_spec(cls, spec: Any) -> dict:
        if isinstance(spec, ScorerSpec):
            spec = spec.spec
        if isinstance(spec, dict) and "weight" in spec:
            raise ValueError("a scorer has no weight (weights combine the rewards of one training stage)")
        try:
            name, options, _ = parse_spec(spec)
            build_reward(spec)  # its values too (extractor names, modes), before anything loads
        except RufusError as err:
            raise ValueError(str(err)) from None
        return {"name": name, "options": options}

    @model_serializer
    def _as_spec(self) -> dict[str, Any]:
        return self.spec

    @property
    def spec(self) -> dict[str, Any]:
        return {"name": self.name, **self.options}

    def reward(self) -> RewardFunction:
        return build_reward(self.spec)

    def with_options(self, **options: Any) -> ScorerSpec:
        return ScorerSpec.model_validate({**self.spec, **options})


class Task(StrictModel):
    name: str = Field(pattern=r"^[a-z0-9_]+$")
    kind: Literal["rufus", "lm_eval"]
    role: Literal["validation", "test"]
    about: str = ""  # one line: what the task is and where its number comes from
    # the registry entry (catalogs/benchmarks.yaml) of the task's data; an lm_eval task names it for
    # the files it fetches while it runs (RULER's haystacks) and for decontam
    benchmark: str | None = None
    # kind: lm_eval
    lm_eval_task: str | None = None
    metric_key: str | None = None  # which of the native task's metrics is reported
    # kind: rufus
    data: DatasetSource | None = None  # inline data of a suite of your own, instead of `benchmark`
    prompt: str | None = None  # str.format template over the data row's fields
    gold_fields: list[str] = Field(default_factory=list)  # row fields the scorer reads (its dataset columns)
    skip_rows: dict[str, list[str]] = Field(default_factory=dict)  # field -> values whose rows are skipped
    scorer: ScorerSpec | None = None
    # a second reward over the same answers, reported beside the headline (avg@k only), never in its place
    also_scored_by: ScorerSpec | None = None
    metric: str = "avg@k"
    repeats: int | None = Field(None, ge=1)  # k; default: the suite's
    sampling: Sampling | None = None

    @model_validator(mode="before")
    @classmethod
    def _samples_is_repeats(cls, data: Any, info: ValidationInfo) -> Any:
        data, renamed = renamed_key(data, "samples", "repeats")
        if renamed:
            _say_repeats(config_source(info, "a suite task"), [f"task {data.get('name')}"])
        return data

    @model_validator(mode="after")
    def _complete(self) -> Task:
        if self.kind == "lm_eval":
            if not (self.lm_eval_task and self.metric_key):
                raise ValueError("an lm_eval task needs lm_eval_task and metric_key")
            return self
        if (self.benchmark is None) == (self.data is None):
            raise ValueError("a rufus task names its data once: `benchmark` (an entry of catalogs/benchmarks.yaml) "
                             "or `data` (inline: path, local or hub)")
        missing = [k for k in ("prompt", "scorer") if getattr(self, k) is None]
        if missing:
            raise ValueError(f"a rufus task needs {', '.join(missing)}")
        if not self.gold_fields:
            raise ValueError("a rufus task needs gold_fields (the row fields its scorer reads)")
        match = METRIC_RE.match(self.metric)
        if not match:
            raise ValueError(f"metric {self.metric!r} must be avg@k, pass@N, maj@N or maj@k")
        if self.also_scored_by is not None and match.group(1) != "avg":
            raise ValueError(f"also_scored_by is reported as avg@k beside the headline; metric is {self.metric}: "
                             "use avg@k, or drop also_scored_by")
        if match.group(1) == "maj" and self.scorer.reward().answer_extractor is None:
            raise ValueError(f"maj@ needs an answer to vote on; reward {self.scorer.name} extracts none "
                             "(string_match and math_equivalence do)")
        if self.scorer.name == "llm_judge":
            reference = self.scorer.options.get("reference_column") or self.gold_fields[0]
            if reference not in self.gold_fields:
                raise ValueError(f"scorer.reference_column {reference!r} must be one of gold_fields {self.gold_fields} "
                                 "(the judge compares answers against that field of the row)")
            # the default reference is the first gold field (set without re-running this validator)
            object.__setattr__(self, "scorer", self.scorer.with_options(reference_column=reference))
        return self


class Suite(StrictModel):
    name: str
    description: str = ""
    repeats: int = Field(4, ge=1)  # default k
    sampling: Sampling = Sampling()
    system_prompt: str | None = None  # e.g. "/think" or "/no_think" for hybrid reasoning models
    thinking: ThinkingMode = "default"  # on/off through the template's own switch (rufus_data/models/thinking.py)
    think_end_token: str = "</think>"
    seed: int = 0
    tasks: list[Task]

    _thinking_as_written = field_validator("thinking", mode="before")(yaml_thinking_mode)

    @model_validator(mode="before")
    @classmethod
    def _samples_is_repeats(cls, data: Any, info: ValidationInfo) -> Any:
        """Suites written before k was `repeats`: one warning for the file, every place named."""
        data, renamed = renamed_key(data, "samples", "repeats")
        places = ["top level"] if renamed else []
        if isinstance(data, dict) and isinstance(data.get("tasks"), list):
            tasks = []
            for task in data["tasks"]:
                task, renamed = renamed_key(task, "samples", "repeats")
                places += [f"task {task.get('name')}"] if renamed else []
                tasks.append(task)
            data = {**data, "tasks": tasks}
        if places:
            _say_repeats(config_source(info, f"suite {data.get('name')}"), places)
        return data

    @model_validator(mode="after")
    def _unique(self) -> Suite:
        names = [t.name for t in self.tasks]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"task names must be unique: {dupes}")
        return self

    def k(self, task: Task) -> int:
        return task.repeats or self.repeats

    def sampling_for(self, task: Task) -> Sampling:
        return task.sampling or self.sampling

    def metric_at(self, task: Task) -> tuple[str, int]:
        """('avg'|'pass'|'maj', n) with n resolved against k and checked."""
        kind, at = METRIC_RE.match(task.metric).groups()
        k = self.k(task)
        n = k if at == "k" else int(at)
        if kind == "avg" and n != k:
            raise RufusError(f"suite {self.name}, task {task.name}: avg@{n} must average all k={k} samples")
        if n > k:
            raise RufusError(f"suite {self.name}, task {task.name}: {task.metric} needs at least {n} samples, k={k}")
        return kind, n

    def selected(self, final: bool) -> list[Task]:
        """Validation tasks always; test tasks only for a final evaluation."""
        return [t for t in self.tasks if t.role == "validation" or final]


def task_benchmark(task: Task, registry: Registry) -> str | None:
    """The registry benchmark a task scores: its `benchmark:`, else the one named like the task;
    None for a task whose data is inline in its suite (no benchmark to check data against)."""
    if task.data is not None:
        return None
    return task.benchmark or (task.name if task.name in registry.benchmarks else None)


def find_suite(name: str) -> Path | None:
    """A suite name from catalogs/suites/ (the user's own, else the shipped ones), or a path to a
    suite YAML; None when `name` is neither."""
    path = Path(name)
    if path.suffix in (".yaml", ".yml") or path.is_file():
        return resolve_entry(path)  # `catalogs/suites/X.yaml` installed: the shipped one
    return find_catalog_file(f"suites/{name}.yaml")


def known_suites() -> list[str]:
    return catalog_names("suites")


def suite_path(name: str) -> Path:
    """A suite name from catalogs/suites/, or a path to a suite YAML."""
    path = find_suite(name)
    if path is None:
        raise RufusError(f"no suite named {name!r} ({looked_in(f'suites/{name}.yaml')}): known suites are "
                         f"{known_suites()}, or give a path to a suite YAML")
    return path


def load_suite(name: str, registry_file: str | Path | None = None) -> Suite:
    """The suite, validated, its tasks' benchmarks checked against the registry (default
    catalogs/benchmarks.yaml) and inline data paths made relative to the suite file."""
    path = suite_path(name)
    suite = load_yaml_model(path, Suite)
    registry, registry_path = load_registry(registry_file)
    for task in suite.tasks:
        if task.benchmark is not None and task.benchmark not in registry.benchmarks:
            close = difflib.get_close_matches(task.benchmark, list(registry.benchmarks), n=1)
            raise RufusError(f"{path}: task {task.name} names unknown benchmark {task.benchmark!r}"
                             f"{f' (did you mean {close[0]!r}?)' if close else ''}; the benchmarks are the entries "
                             f"of {registry_path}")
        if task.data is not None and task.data.path and not Path(task.data.path).expanduser().is_absolute():
            task.data.path = str(path.resolve().parent / task.data.path)  # relative to the suite file
        if task.kind == "rufus":
            suite.metric_at(task)
            if suite.k(task) > 1 and suite.sampling_for(task).temperature == 0:
                raise RufusError(
                    f"suite {suite.name}, task {task.name}: k={suite.k(task)} samples at temperature 0 are "
                    "k copies of one answer; set a temperature > 0 or repeats: 1"
                )
    return suite
