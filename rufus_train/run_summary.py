"""How a stage ends for the person who ran it: a summary table (steps, final loss, tokens seen,
time, how far the weights moved) and train_curves.png, the curves of metrics.jsonl; and the
tracker naming every run shares: project `rufus` (WANDB_PROJECT / TRACKIO_PROJECT win) and a
run name from the stage and output folder, a pipeline's stages grouped under its folder."""

from __future__ import annotations

import os
import re
from pathlib import Path

from rich.table import Table

from rufus_data.folders.run_folder import TRAIN_CURVES

PROJECT = "rufus"
PIPELINE_STAGE = re.compile(r"^\d{2}-")  # a pipeline's stage folder: runs/NAME/01-sft (rufus_train/pipeline.py)
CURVE_KEYS = ("loss", "learning_rate", "grad_norm")


def run_name(stage: str, out: Path) -> str:
    """`sft` for runs/sft, `sft-my-run` for runs/my-run, `p/01-sft` for a pipeline p's first stage."""
    if PIPELINE_STAGE.match(out.name):
        return f"{out.parent.name}/{out.name}"
    return out.name if out.name == stage or out.name.startswith(f"{stage}-") else f"{stage}-{out.name}"


def tracker_settings(stage: str, out: Path) -> dict:
    """The TRL config fields of the naming (the `trainer:` block still overrides them); sets the
    W&B project and a pipeline's group in the environment, where transformers reads them."""
    os.environ.setdefault("WANDB_PROJECT", PROJECT)
    if PIPELINE_STAGE.match(out.name):
        os.environ.setdefault("WANDB_RUN_GROUP", out.parent.name)
    return {"project": os.environ.get("TRACKIO_PROJECT") or PROJECT, "run_name": run_name(stage, out)}


def final_value(metrics: list[dict], key: str):
    return next((entry[key] for entry in reversed(metrics) if isinstance(entry.get(key), (int, float))), None)


def summary_table(out: Path, summary: dict, metrics: list[dict]) -> Table:
    """The table a stage ends with, from what run.json records and the logged metrics."""
    loss = final_value([m for m in metrics if "train_loss" not in m], "loss")
    tokens = final_value(metrics, "num_tokens")
    moved = (summary.get("weight_update") or {}).get("relative")
    table = Table(title=f"stage {summary['stage']}: {out.name}")
    for column in ("steps", "final loss", "tokens seen", "time", "||dW||/||W||"):
        table.add_column(column, justify="right")
    table.add_row(str(summary["global_step"]), "-" if loss is None else f"{loss:.4g}",
                  "-" if tokens is None else f"{int(tokens):,}", f"{summary['seconds']:.1f} s",
                  "-" if moved is None else f"{moved:.3g}")
    return table


def write_train_curves(out: Path, metrics: list[dict]) -> Path | None:
    """train_curves.png: loss, learning rate and gradient norm per step (and the checkpoint
    evaluations, eval/*, when there are any); None when nothing was logged."""
    panels = [key for key in CURVE_KEYS if any(key in m for m in metrics)]
    evals = sorted({key for m in metrics for key in m if key.startswith("eval/") and key != "eval/step"})
    if not panels and not evals:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    count = len(panels) + bool(evals)
    figure, axes = plt.subplots(1, count, figsize=(4.2 * count, 3.2), squeeze=False)
    for axis, key in zip(axes[0], panels):
        points = [(m["step"], m[key]) for m in metrics if isinstance(m.get(key), (int, float))]
        axis.plot(*zip(*points), marker="o" if len(points) < 20 else None)
        axis.set(title=key, xlabel="step")
    if evals:
        axis = axes[0][-1]
        for key in evals:
            points = [(m.get("eval/step", m["step"]), m[key]) for m in metrics if key in m]
            axis.plot(*zip(*points), marker="o", label=key.removeprefix("eval/"))
        axis.set(title="checkpoint evaluation", xlabel="step")
        axis.legend(fontsize="small")
    figure.suptitle(out.name)
    figure.tight_layout()
    path = out / TRAIN_CURVES
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return path
