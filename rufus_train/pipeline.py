"""`rufus-train pipeline FILE`: stages in order, each starting from the previous stage's output,
with an evaluation of the base and of every stage (the Tulu 3 table: base / sft / dpo / rlvr),
ending with the last stage merged into a plain model folder ready for inference.

The evaluation is a rufus-eval suite (default: the offline `quick` suite's GSM8K task on a few
test problems), run on the base model and on each stage's output with greedy decoding, so every
row of the table scores the same items the same way, and its numbers are the ones
`rufus-eval suite` reports; each run also lands in `<output_dir>/eval/`.

`rufus-train pipeline FILE --dry-run` prints every stage's resolved config, as
`rufus-train stage --dry-run` prints it, and loads nothing."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import Field, ValidationError

from rufus_data.base.catalog_files import resolve_entry
from rufus_data.base.console import console, print_result
from rufus_data.base.errors import RufusError
from rufus_data.base.yaml_config import StrictModel, format_validation_error, read_yaml
from rufus_data.benchmarks.suite import load_suite
from rufus_data.folders.output_lock import OutputLock
from rufus_data.folders.run_folder import MERGED_DIR
from rufus_data.models.reference import ModelRef
from rufus_eval.request import EvalRequest, EvalSettings, FolderBackend
from rufus_train import guidance
from rufus_train.config import StageConfig
from rufus_train.config_loading import _expand_env, load_stage_config, resolved_yaml, stage_file
from rufus_train.modeling import export_merged
from rufus_train.runner import run_stage
from rufus_train.stages import check_config, get_stage

CHAINED_KEYS = ("model", "output_dir")  # set by the pipeline for every stage


class StageEval(EvalSettings):
    """Which rufus-eval suite scores each stage, and how much of it (small: it runs 1 + N times):
    the evaluation request's settings (rufus_eval/request.py), with the pipeline's defaults."""

    suite: str = Field("quick", description="suite name in catalogs/suites/ or a suite YAML path")
    tasks: list[str] | None = Field(default_factory=lambda: ["gsm8k"], description="tasks of the suite (null: all)")
    limit: int | None = Field(32, ge=1, description="documents per task: the first N, the same for every stage")
    repeats: int | None = Field(1, ge=1, description="k, answers per document (overrides the suite)")
    max_tokens: int | None = Field(200, ge=1, description="generation budget (overrides the suite)")
    temperature: float | None = Field(0.0, ge=0, description="0: greedy decoding; null: the suite's own sampling")
    backend: FolderBackend = "hf"


class PipelineConfig(StrictModel):
    name: str
    model: str = "smollm2-135m"
    output_dir: str = "runs/{name}"
    overwrite: bool = False
    defaults: dict[str, Any] = Field(
        default_factory=dict, description="keys every stage gets unless it sets them (`trainer:` merged key by key)"
    )
    recipe: str | None = Field(None, description="the source document whose settings the file ships (said by warnings "
                               "that the playbook advises otherwise)")
    adapter: Literal["per_stage", "one"] = Field(
        "per_stage", description="per_stage: each LoRA stage merges the previous stage and trains a new adapter (its "
        "reference: the previous stage); one: every stage trains the first stage's adapter further (the reference of "
        "DPO and RL: the original model, the adapter off), as the Tulu 3 mini notebook")
    merge: bool = Field(True, description="merge the last stage's LoRA adapter into OUT/merged (model + tokenizer)")
    eval: StageEval | None = None
    stages: list[dict[str, Any]] = Field(
        min_length=1, description="each: stage NAME, optional config FILE, label (its row in the table), overrides")

    def labels(self) -> list[str]:
        """Each stage's row name in the table: its `label`, else the stage's name."""
        return [entry.get("label") or entry["stage"] for entry in self.stages]


def load_pipeline(path: str | Path, model: str | None = None) -> PipelineConfig:
    """Read and validate a pipeline file: every stage config and the eval block, before anything
    trains. A shipped pipeline's relative path (`catalogs/pipelines/...`) works from any folder.
    `model`: the base model instead of the file's `model:` (`--model`)."""
    path = resolve_entry(path)
    data, node = read_yaml(path)
    if not isinstance(data, dict):
        raise RufusError(f"{path}: a pipeline is a mapping with `name` and `stages`")
    data.setdefault("name", path.stem)
    if model:
        data["model"] = model
    try:
        config = PipelineConfig.model_validate(_expand_env(data))
    except ValidationError as err:
        raise RufusError("invalid pipeline in " + format_validation_error(err, path, node, PipelineConfig)) from None
    config.output_dir = config.output_dir.replace("{name}", config.name)
    for key in CHAINED_KEYS:
        if key in config.defaults:
            raise RufusError(f"{path}: defaults sets `{key}`, which the pipeline chains itself; remove it")
    for i, entry in enumerate(config.stages):
        if "stage" not in entry:
            raise RufusError(f"{path}: stages[{i}] has no `stage:` key (one of the names `rufus-train stages` lists)")
        for key in CHAINED_KEYS:
            if key in entry:
                raise RufusError(f"{path}: stages[{i}] sets `{key}`, which the pipeline chains itself; remove it")
    stage_configs(config, source=str(path), notes=None)  # every stage config valid now, before anything trains
    if config.eval:
        suite = load_suite(config.eval.suite)
        unknown = sorted(set(config.eval.tasks or []) - {t.name for t in suite.tasks})
        if unknown:
            raise RufusError(f"{path}: eval.tasks {unknown} are not in suite {suite.name}: use some of "
                             f"{', '.join(t.name for t in suite.tasks)}")
    return config


def with_defaults(defaults: dict[str, Any], entry: dict[str, Any]) -> dict[str, Any]:
    """The stage entry over the pipeline's defaults; mappings (`trainer:`, `lora:`) merge key by key."""
    merged = dict(defaults)
    for key, value in entry.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = {**merged[key], **value}
        else:
            merged[key] = value
    return merged


def stage_configs(pipeline: PipelineConfig, source: str | None = None, notes: list[str] | None = None) -> list[StageConfig]:
    """The resolved config of each stage: model = previous output, output = OUT/NN-stage. A key
    of a stage's entry (or of `defaults`) is named in errors as `source`'s (the pipeline file's);
    the notes of TRL keys taken into `trainer:` are printed where `notes` is None (load_pipeline
    says them once), else collected into it."""
    configs, model = [], pipeline.model
    source = source or f"pipeline {pipeline.name}"
    for i, entry in enumerate(pipeline.stages):
        entry = with_defaults(pipeline.defaults, entry)
        name = entry.pop("stage")
        entry.pop("label", None)
        config_file = entry.pop("config", None) or stage_file(name)
        out = Path(pipeline.output_dir) / f"{i + 1:02d}-{name}"
        if pipeline.adapter == "one" and i > 0:  # the first stage's adapter, trained on by every later one
            entry["lora"] = {**entry.get("lora", {}), "continue_adapter": True}
        overrides = {**entry, "model": model, "output_dir": str(out), "overwrite": pipeline.overwrite}
        where = f"{source} stages[{i}] ({name}{' or defaults' if pipeline.defaults else ''}) key {{key}}"
        configs.append(load_stage_config(name, get_stage(name).config_class, config_file, overrides, where,
                                         notes=notes))
        model = str(out)
    if pipeline.adapter == "one" and not configs[0].lora.enabled:
        raise RufusError(f"{source}: adapter: one trains the first stage's LoRA adapter through every stage, and "
                         f"stage {configs[0].stage} fine-tunes fully (lora.enabled false): enable LoRA there, or "
                         "use adapter: per_stage")
    return configs


def check_stages(pipeline: PipelineConfig, configs: list[StageConfig]) -> None:
    """Every guard that needs nothing loaded, for every stage. A later stage starts from a run
    folder that exists only once the earlier stages ran, so it is checked against the pipeline's
    base model (same architecture, tokenizer and context)."""
    for i, config in enumerate(configs):
        check_config(config if i == 0 else config.model_copy(update={"model": pipeline.model}))
    guidance.check_pipeline(configs, pipeline.recipe)  # the playbook's advice on how the stages relate (warnings)


def dry_run(pipeline: PipelineConfig) -> str:
    """Every stage's resolved config (as `rufus-train stage --dry-run` prints it), then the
    evaluation and the merge; checks run, nothing loads or trains."""
    configs = stage_configs(pipeline, notes=[])  # load_pipeline said them
    check_stages(pipeline, configs)
    parts = []
    for i, config in enumerate(configs):
        parts.append(f"# stage {i + 1} of {len(configs)}: {config.stage} -> {config.output_dir}\n{resolved_yaml(config)}")
    if pipeline.eval:
        settings = yaml.safe_dump(pipeline.eval.model_dump(mode="json"), sort_keys=False)
        parts.append("# evaluation of the base and of every stage\neval:\n" + _indent(settings))
    merged = merged_path(pipeline) if pipeline.merge else None
    parts.append(f"# final model\nmerge: {str(pipeline.merge).lower()}" + (f"  # -> {merged}\n" if merged else "\n"))
    return "\n".join(parts)


def _indent(text: str) -> str:
    return "".join(f"  {line}\n" for line in text.splitlines())


def merged_path(pipeline: PipelineConfig) -> Path:
    return Path(pipeline.output_dir) / MERGED_DIR


def run_pipeline(pipeline: PipelineConfig) -> list[dict]:
    """Train every stage in order; evaluate base and each stage; merge the last; print and save the table."""
    configs = stage_configs(pipeline, notes=[])  # load_pipeline said them
    with OutputLock(pipeline.output_dir, "rufus-train pipeline"):  # one pipeline per output_dir
        check_stages(pipeline, configs)
        out = Path(pipeline.output_dir)
        rows: list[dict] = []
        caption = scorer_caption(pipeline.eval)
        if pipeline.eval:
            base = stage_eval(pipeline.model, pipeline.eval, out, "00-base", pipeline.overwrite)
            rows.append({"stage": "base", "model": pipeline.model, **base})
            print_table(rows, pipeline.name, caption)
        for config, label in zip(configs, pipeline.labels(), strict=True):
            started = time.time()
            result = run_stage(config)
            row = {"stage": label, "model": config.output_dir, "steps": result.global_step,
                   "train_s": round(time.time() - started, 1)}
            if pipeline.eval:
                row.update(stage_eval(config.output_dir, pipeline.eval, out, Path(config.output_dir).name,
                                      pipeline.overwrite))
            rows.append(row)
            print_table(rows, pipeline.name, caption)
        final = ModelRef.of(configs[-1].output_dir)
        if pipeline.merge and final.is_adapter:
            shutil.rmtree(merged_path(pipeline), ignore_errors=True)  # a rerun's stages were replaced too
            export_merged(final, merged_path(pipeline))
            console.print(f"[green]merged[/] {final.path} and every adapter below it into {merged_path(pipeline)} "
                          "(model + tokenizer, ready for inference)")
        elif pipeline.merge:
            console.print(f"{final.path} is a full fine-tuning run: it already is a plain model folder")
        (out / "pipeline.json").write_text(json.dumps(rows, indent=2) + "\n")
        return rows


def stage_request(model_ref: str, settings: StageEval, out: Path, tag: str, overwrite: bool = False) -> EvalRequest:
    """The evaluation of one model of the pipeline: run OUT/eval/<tag> (`rufus-eval results --runs OUT/eval`
    queries them), replaced by a rerun only with the pipeline's `overwrite`."""
    return settings.request(checkpoint=model_ref, out=out / "eval" / tag, run_name=f"{out.name}-{tag}",
                            overwrite=overwrite)


def stage_eval(model_ref: str, settings: StageEval, out: Path, tag: str, overwrite: bool) -> dict:
    """Run the suite on one model; returns {task: metric value, ..., eval_s} for the table."""
    from rufus_eval.runner import run_suite  # heavy: lm-eval and torch, only when the pipeline evaluates

    started = time.time()
    record = run_suite(stage_request(model_ref, settings, out, tag, overwrite))
    scores = {}
    for name, t in record["tasks"].items():
        scores[f"{name} {t['metric']}"] = t["value"]
        if t.get("also"):  # the same answers under the task's second reward, beside the headline
            scores[f"{name} {t['metric']} by {t['also']['scorer']['name']}"] = t["also"]["value"]
    return {**scores, "eval_s": round(time.time() - started, 1)}


def scorer_caption(settings: StageEval | None) -> str | None:
    """Which reward scores each column of the table: the suite task's scorer, and its also_scored_by."""
    if settings is None:
        return None
    suite = load_suite(settings.suite)
    lines = []
    for task in suite.tasks:
        if (settings.tasks is None or task.name in settings.tasks) and task.kind == "rufus":
            lines.append(f"{task.name}: scored by {_spec_text(task.scorer.spec)}")
            if task.also_scored_by:
                lines.append(f"{task.name} ... by {task.also_scored_by.name}: the same answers scored by "
                             f"{_spec_text(task.also_scored_by.spec)}")
    return "\n".join(lines) or None


def _spec_text(spec: dict) -> str:
    return spec["name"] + "".join(f", {k} {v}" for k, v in spec.items() if k != "name")


def print_table(rows: list[dict], name: str, caption: str | None = None) -> None:
    from rich.table import Table

    fixed = ("stage", "model", "steps", "train_s", "eval_s")
    metrics = [k for k in rows[0] if k not in fixed]
    table = Table(title=f"pipeline {name}: evaluation after each stage", caption=caption, caption_justify="left")
    for col in ["stage", *metrics, "steps", "train_s", "eval_s"]:
        table.add_column(col, justify="left" if col == "stage" else "right")
    for row in rows:
        scores = [f"{row[m]:.4f}" if isinstance(row.get(m), float) else "" for m in metrics]
        table.add_row(row["stage"], *scores, str(row.get("steps", "")), str(row.get("train_s", "")),
                      str(row.get("eval_s", "")))
    print_result(table)
