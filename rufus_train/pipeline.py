"""`rufus-train pipeline FILE`: stages in order, each starting from the previous stage's output,
with a quick evaluation of the base and of every stage (the Tulu 3 table: base / sft / dpo / rlvr).

The evaluation is a rufus-eval suite (default: the offline `quick` suite's GSM8K task on a few
test problems), run on the base model and on each stage's output, so the table's numbers are the
same numbers `rufus-eval suite` reports; each run also lands in `<output_dir>/eval/`."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from rufus_data.console import print_result
from rufus_data.errors import RufusError
from rufus_data.generate import BackendConfig
from rufus_data.yaml_config import StrictModel, format_validation_error, read_yaml
from rufus_train.config import _expand_env, load_stage_config, stages_dir
from rufus_train.stages import get_stage


class StageEval(StrictModel):
    """Which rufus-eval suite scores each stage, and how much of it (small: it runs 1 + N times)."""

    suite: str = Field("quick", description="suite name in catalogs/suites/ or a suite YAML path")
    tasks: list[str] | None = Field(default_factory=lambda: ["gsm8k"], description="tasks of the suite (null: all)")
    limit: int | None = Field(32, ge=1, description="documents per task")
    samples: int | None = Field(1, ge=1, description="k per document (overrides the suite)")
    max_tokens: int | None = Field(200, ge=1, description="generation budget (overrides the suite)")
    backend: Literal["hf", "vllm"] = "hf"
    batch_size: int = Field(16, ge=1, description="hf backend batch size")


class PipelineConfig(StrictModel):
    name: str
    model: str = "smollm2-135m"
    output_dir: str = "runs/{name}"
    overwrite: bool = False
    eval: StageEval | None = None
    stages: list[dict[str, Any]] = Field(min_length=1, description="each: stage NAME, optional config FILE, overrides")


def load_pipeline(path: str | Path) -> PipelineConfig:
    path = Path(path)
    data, node = read_yaml(path)
    if not isinstance(data, dict):
        raise RufusError(f"{path}: a pipeline is a mapping with `name` and `stages`")
    data.setdefault("name", path.stem)
    from pydantic import ValidationError

    try:
        config = PipelineConfig.model_validate(_expand_env(data))
    except ValidationError as err:
        raise RufusError("invalid pipeline in " + format_validation_error(err, path, node, PipelineConfig)) from None
    config.output_dir = config.output_dir.replace("{name}", config.name)
    for i, entry in enumerate(config.stages):
        if "stage" not in entry:
            raise RufusError(f"{path}: stages[{i}] has no `stage:` key (one of the names `rufus-train stages` lists)")
        for key in ("model", "output_dir"):
            if key in entry:
                raise RufusError(f"{path}: stages[{i}] sets `{key}`, which the pipeline chains itself; remove it")
        stage_configs(config, upto=i + 1)  # validate every stage config now, before anything trains
    if config.eval:
        from rufus_eval.suite import load_suite

        suite = load_suite(config.eval.suite)
        unknown = sorted(set(config.eval.tasks or []) - {t.name for t in suite.tasks})
        if unknown:
            raise RufusError(f"{path}: eval.tasks {unknown} are not in suite {suite.name}: use some of "
                             f"{', '.join(t.name for t in suite.tasks)}")
    return config


def stage_configs(pipeline: PipelineConfig, upto: int | None = None) -> list:
    """The resolved config of each stage: model = previous output, output = OUT/NN-stage."""
    configs, model = [], pipeline.model
    for i, entry in enumerate(pipeline.stages[:upto]):
        entry = dict(entry)
        name = entry.pop("stage")
        config_file = entry.pop("config", None) or stages_dir() / f"{name}.yaml"
        out = Path(pipeline.output_dir) / f"{i + 1:02d}-{name}"
        overrides = {**entry, "model": model, "output_dir": str(out), "overwrite": pipeline.overwrite}
        configs.append(load_stage_config(name, get_stage(name).config_class, config_file, overrides))
        model = str(out)
    return configs


def run_pipeline(pipeline: PipelineConfig) -> list[dict]:
    """Train every stage in order; evaluate base and each stage; print and save the table."""
    from rufus_train.runner import check_config, run_stage

    configs = stage_configs(pipeline)
    for config in configs[:1]:
        check_config(config)  # later stages' models exist only once the earlier ones ran
    out = Path(pipeline.output_dir)
    rows: list[dict] = []
    if pipeline.eval:
        rows.append({"stage": "base", "model": pipeline.model, **stage_eval(pipeline.model, pipeline.eval, out, "00-base")})
        print_table(rows, pipeline.name)
    for config in configs:
        started = time.time()
        run_stage(config)
        row = {"stage": config.stage, "model": config.output_dir, "train_s": round(time.time() - started, 1)}
        if pipeline.eval:
            row.update(stage_eval(config.output_dir, pipeline.eval, out, Path(config.output_dir).name))
        rows.append(row)
        print_table(rows, pipeline.name)
    (out / "pipeline.json").write_text(json.dumps(rows, indent=2) + "\n")
    return rows


def stage_eval(model_ref: str, settings: StageEval, out: Path, tag: str) -> dict:
    """Run the suite on one model; returns {task: metric value, ..., eval_s} for the table."""
    # lm-eval (and torch) load with these: only when the pipeline evaluates
    from rufus_eval.backends import CONCURRENCY
    from rufus_eval.runner import RunRequest, run_suite

    started = time.time()
    record = run_suite(RunRequest(
        suite=settings.suite,
        checkpoint=model_ref,
        backend=BackendConfig(backend=settings.backend, batch_size=settings.batch_size, concurrency=CONCURRENCY),
        limit=settings.limit,
        out=out / "eval" / tag,
        run_name=f"{out.name}-{tag}",
        db_path=out / "eval" / "results.duckdb",
        samples=settings.samples,
        max_tokens=settings.max_tokens,
        tasks=settings.tasks,
    ))
    scores = {f"{name} {t['metric']}": t["value"] for name, t in record["tasks"].items()}
    return {**scores, "eval_s": round(time.time() - started, 1)}


def print_table(rows: list[dict], name: str) -> None:
    from rich.table import Table

    metrics = [k for k in rows[0] if k not in ("stage", "model", "train_s", "eval_s")]
    table = Table(title=f"pipeline {name}: evaluation after each stage")
    for col in ["stage", *metrics, "train_s", "eval_s"]:
        table.add_column(col, justify="left" if col == "stage" else "right")
    for row in rows:
        scores = [f"{row[m]:.4f}" if isinstance(row.get(m), float) else "" for m in metrics]
        table.add_row(row["stage"], *scores, str(row.get("train_s", "")), str(row.get("eval_s", "")))
    print_result(table)
