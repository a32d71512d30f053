"""`rufus-train pipeline FILE`: stages in order, each starting from the previous stage's output,
with a quick evaluation of the base and of every stage (the Tulu 3 table: base / sft / dpo / rlvr).

The quick evaluation is greedy generation on a held-out split of RL rows (`prompt` +
`expected_output`) scored with a reward from `rufus_data.rewards` (default: string_match with the
GSM8K `#### N` extractor). It is a smoke signal for a pipeline, not a benchmark: rufus-eval's
suites are the benchmark."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from pydantic import Field

from rufus_data.console import console
from rufus_data.errors import RufusError
from rufus_data.yaml_config import format_validation_error, read_yaml
from rufus_train.config import Strict, _expand_env, load_stage_config, stages_dir
from rufus_train.stages import get_stage


class QuickEval(Strict):
    data: str = Field(description="shard folder of held-out RL rows (prompt + expected_output)")
    rows: int = Field(32, ge=1)
    max_new_tokens: int = Field(256, ge=1)
    batch_size: int = Field(16, ge=1)
    reward: str | dict[str, Any] = Field(
        default_factory=lambda: {"name": "string_match", "extractor": "gsm8k", "answer_column": "expected_output"}
    )


class PipelineConfig(Strict):
    name: str
    model: str = "smollm2-135m"
    output_dir: str = "runs/{name}"
    overwrite: bool = False
    eval: QuickEval | None = None
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
    rows: list[dict] = []
    if pipeline.eval:
        rows.append({"stage": "base", "model": pipeline.model, **quick_eval(pipeline.model, pipeline.eval)})
        print_table(rows, pipeline.name)
    for config in configs:
        started = time.time()
        run_stage(config)
        row = {"stage": config.stage, "model": config.output_dir, "train_s": round(time.time() - started, 1)}
        if pipeline.eval:
            row.update(quick_eval(config.output_dir, pipeline.eval))
        rows.append(row)
        print_table(rows, pipeline.name)
    out = Path(pipeline.output_dir)
    (out / "pipeline.json").write_text(json.dumps(rows, indent=2) + "\n")
    return rows


def quick_eval(model_ref: str, settings: QuickEval) -> dict:
    """Greedy answers to held-out prompts, scored with the reward: accuracy and mean length."""
    import torch

    from rufus_data.rewards import build_reward
    from rufus_data.shards import read_shards
    from rufus_train.modeling import load_model, load_tokenizer
    from rufus_train.stages.base import conversational

    started = time.time()
    table = read_shards(settings.data).slice(0, settings.rows)
    prompts = conversational(table, "prompt")
    tokenizer = load_tokenizer(model_ref)
    tokenizer.padding_side = "left"
    model = load_model(model_ref, "auto").eval()
    texts, lengths = [], []
    for start in range(0, len(prompts), settings.batch_size):
        batch = prompts[start : start + settings.batch_size]
        encoded = tokenizer.apply_chat_template(
            batch, add_generation_prompt=True, tokenize=True, return_dict=True, padding=True, return_tensors="pt"
        )
        with torch.no_grad():
            output = model.generate(
                **encoded, max_new_tokens=settings.max_new_tokens, do_sample=False, pad_token_id=tokenizer.pad_token_id
            )
        new = output[:, encoded["input_ids"].shape[1] :]
        for ids in new:
            ids = [t for t in ids.tolist() if t != tokenizer.pad_token_id]
            lengths.append(len(ids))
            texts.append(tokenizer.decode(ids, skip_special_tokens=True))
    reward = build_reward(settings.reward)
    columns = {name: table.column(name).to_pylist() for name in table.column_names if name != "prompt"}
    scores = reward(prompts=prompts, completions=[[{"role": "assistant", "content": t}] for t in texts], **columns)
    scored = [s for s in scores if s is not None]
    return {
        "accuracy": round(sum(scored) / len(scored), 4) if scored else None,
        "rows": len(texts),
        "mean_tokens": round(sum(lengths) / len(lengths), 1),
        "eval_s": round(time.time() - started, 1),
    }


def print_table(rows: list[dict], name: str) -> None:
    from rich.table import Table

    table = Table(title=f"pipeline {name}: quick evaluation after each stage")
    for col in ("stage", "accuracy", "rows", "mean_tokens", "train_s", "eval_s"):
        table.add_column(col, justify="left" if col == "stage" else "right")
    for row in rows:
        table.add_row(*(str(row.get(col, "")) for col in ("stage", "accuracy", "rows", "mean_tokens", "train_s", "eval_s")))
    console.print(table)
