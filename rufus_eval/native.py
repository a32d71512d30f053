"""lm-eval's own tasks (`kind: lm_eval`), run through configs Rufus writes around them.

A native generative task scores the raw response, `<think>` block and all: GPQA's regex finds a
letter inside the reasoning, RULER's match reads the reasoning's words. So for each native task
(and each task of a native group) Rufus writes a config into the run's `tasks/` folder that
`include`s lm-eval's own YAML by path (its `!function`s still resolve next to it) under a Rufus
name, and puts `rufus_strip_reasoning` first in every filter pipeline: the native filters and
metric then see the answer after reasoning, and an unclosed `<think>` leaves an empty answer,
as in the Rufus-defined tasks. Log-likelihood tasks generate nothing and keep their filters.

The native YAML is found by scanning lm-eval's task folder for `task:`/`group:` NAME (about two
seconds), not by building lm-eval's whole task index (about a minute on two cores)."""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

import lm_eval
import yaml
from lm_eval.tasks._yaml_loader import load_yaml

from rufus_data.base.errors import RufusError
from rufus_data.benchmarks.suite import Suite, Task

TASKS_ROOT = Path(lm_eval.__file__).resolve().parent / "tasks"
GENERATIVE = "generate_until"


def _name_pattern(name: str) -> re.Pattern:
    return re.compile(rf"^(?:task|group):\s*['\"]?{re.escape(name)}['\"]?\s*$", re.MULTILINE)


@cache
def native_yaml(name: str, root: Path = TASKS_ROOT) -> Path:
    """The YAML file of lm-eval's task or group NAME, or NAME itself when it is a task YAML of your own."""
    own = Path(name).expanduser()
    if own.suffix in (".yaml", ".yml"):
        if not own.is_file():
            raise RufusError(f"lm_eval_task {name}: no such task YAML file")
        return own.resolve()
    pattern = _name_pattern(name)
    found = sorted(p for p in root.rglob("*.yaml") if pattern.search(p.read_text(encoding="utf-8", errors="ignore")))
    if not found:
        raise RufusError(f"lm-eval {lm_eval.__version__} has no task or group named {name!r}: check `lm_eval_task` "
                         "(`lm-eval ls tasks` lists them)")
    return found[0]


def strip_first(filter_list: list[dict] | None, think_end_token: str) -> list[dict]:
    """Every filter pipeline with reasoning stripping first; none given = lm-eval's default (`none`: take_first)."""
    pipelines = filter_list or [{"name": "none", "filter": [{"function": "take_first"}]}]
    return [{"name": p["name"], "filter": [{"function": "rufus_strip_reasoning", "think_end_token": think_end_token},
                                           *p.get("filter", [])]} for p in pipelines]


def native_name(suite: Suite, name: str) -> str:
    return f"rufus_{suite.name}_{name}".replace("-", "_")


def write_native(suite: Suite, task: Task, folder: Path, root: Path = TASKS_ROOT) -> str:
    """Write the Rufus configs around the task's native task or group into `folder`; return the name to run."""
    folder.mkdir(parents=True, exist_ok=True)
    return _wrap(suite, task.lm_eval_task, folder, root, seen=set())


def _wrap(suite: Suite, name: str, folder: Path, root: Path, seen: set[str]) -> str:
    if name in seen:
        raise RufusError(f"lm-eval group {name!r} contains itself")
    seen.add(name)
    path = native_yaml(name, root)
    config = load_yaml(path, resolve_func=False)
    native = config.get("group") or config.get("task") or name
    wrapped = native_name(suite, str(native))
    if "group" in config and "task" in config and isinstance(config["task"], list):
        members = config.get("task") or []
        if not all(isinstance(m, str) for m in members):
            raise RufusError(f"lm-eval group {name} ({path}) lists inline task configs; name its tasks instead")
        out = {"group": wrapped, "task": [_wrap(suite, m, folder, root, seen) for m in members]}
        out.update({k: config[k] for k in ("aggregate_metric_list", "metadata") if k in config})
    else:
        out = {"include": str(path), "task": wrapped, "tag": []}
        if config.get("output_type") == GENERATIVE:
            out["filter_list"] = strip_first(config.get("filter_list"), suite.think_end_token)
    (folder / f"{wrapped}.yaml").write_text(yaml.safe_dump(out, sort_keys=False))
    return wrapped
