"""The run folder's model card (OUT/README.md), written from run.json when the run ends.

TRL's card names the base model only when it is a hub id: for a local folder, which every
built-in is, it reads "a fine-tuned version of [None](https://huggingface.co/None)". Rufus knows
the base reference (built-in name, hub id or folder), the stage, the data and how the weights
moved, so it writes the card itself (huggingface_hub's ModelCard and ModelCardData): `base_model`,
the Hub datasets its data was mixed from (the lineage), the latest checkpoint evaluation as
`eval_results`. The checkpoints keep TRL's; RUN/merged gets its own (`merged=True`)."""

from __future__ import annotations

import json
from pathlib import Path

from huggingface_hub import EvalResult, ModelCard, ModelCardData

from rufus_data.base.redaction import redact_text
from rufus_data.folders.run_folder import (
    ADAPTER_CONFIG,
    CONFIG_YAML,
    EVAL_LOGS,
    MERGED_DIR,
    METRICS,
    MODEL_CARD,
    RESULTS_JSON,
    RUN_JSON,
    TRAIN_LOG,
    eval_step_dirs,
    is_run_folder,
    read_run_json,
)
from rufus_data.models.builtin import BUILTINS


def hub_base(reference: str) -> str | None:
    """The hub model a reference comes from: a built-in's upstream, a hub id itself, a Rufus run
    folder's own base (a pipeline's later stage); None for any other folder."""
    if reference in BUILTINS:
        return BUILTINS[reference].hub_id
    path = Path(reference)
    if (path / RUN_JSON).exists():
        return hub_base(read_run_json(path).get("base_model") or "")
    if path.exists() or not reference or reference.startswith((".", "/", "~")):
        return None
    return reference


def base_description(reference: str) -> str:
    if reference in BUILTINS:
        spec = BUILTINS[reference]
        return f"`{reference}`, the Rufus built-in {spec.description} ([{spec.hub_id}](https://huggingface.co/{spec.hub_id}))"
    if Path(reference).exists():
        kind = "the Rufus run" if is_run_folder(reference) else "the model folder"
        return f"{kind} `{reference}`"
    return f"[{reference}](https://huggingface.co/{reference})"


def hub_datasets(lineage: dict | None) -> list[str]:
    """The Hub datasets the run's data was mixed from, as its lineage's mix steps record them."""
    found: list[str] = []

    def walk(node: dict) -> None:
        for source in node.get("sources") or []:
            if source.get("origin") == "hub" and source.get("from"):
                found.append(str(source["from"]))
        for item in node.get("inputs") or []:
            walk(item)

    for entry in (lineage or {}).get("data") or []:
        walk(entry.get("folder") or {})
    return list(dict.fromkeys(found))


def checkpoint_evaluation(run: Path) -> tuple[int, dict] | None:
    """The latest finished checkpoint evaluation of a run (RUN/eval_logs/step-N/results.json)."""
    done = [(step, folder) for step, folder in eval_step_dirs(run) if (folder / RESULTS_JSON).exists()]
    if not done:
        return None
    step, folder = done[-1]
    return step, json.loads((folder / RESULTS_JSON).read_text())


def eval_results(run: Path) -> list[EvalResult]:
    """The latest checkpoint evaluation's scored tasks (an unscored one is no result)."""
    found = checkpoint_evaluation(run)
    if found is None:
        return []
    step, record = found
    return [EvalResult(task_type="text-generation", dataset_type=task, dataset_name=task, metric_type=t["metric"],
                       metric_name=f"{t['metric']} (Rufus checkpoint evaluation, step {step})", metric_value=t["value"])
            for task, t in record.get("tasks", {}).items() if t.get("value") is not None]


def model_card(out: Path, summary: dict, merged: bool = False) -> str:
    """The card of a run folder, or (`merged`) of its RUN/merged copy."""
    base = summary["base_model"]
    lora = summary.get("lora")
    run = out.parent if merged else out
    results = eval_results(run)
    metadata = ModelCardData(
        base_model=hub_base(base), library_name="peft" if lora and not merged else "transformers",
        pipeline_tag="text-generation", datasets=hub_datasets(summary.get("lineage")) or None,
        tags=["rufus", "trl", summary["stage"], *(["lora"] if lora else []), *([MERGED_DIR] if merged else [])],
        model_name=run.name if results else None, eval_results=results or None,
    )
    method = f"a LoRA adapter (r={lora['r']}, alpha={lora['alpha']})" if lora else "full fine-tuning"
    if merged:
        method += f", merged into a copy of its base (the adapter alone: `{run}`)"
    final = summary.get("final_metrics") or {}
    loss = final.get("train_loss", final.get("loss"))
    data = ", ".join(f"`{d}`" for d in summary.get("data") or []) or "its data"
    diverged = summary.get("diverged")
    lines = [
        f"# {run.name}{f'/{MERGED_DIR}' if merged else ''}",
        "",
        (f"A fine-tuned version of {base_description(base)}: Rufus stage `{summary['stage']}`, {method}, "
         f"{summary['global_step']} steps on {data}."),
        "",
        *([f"**Training diverged: no model was saved.** {summary['warning']}", ""] if diverged else []),
        *([f"**Training stopped: no model was saved.** {summary['warning']}", ""] if summary.get("stopped") else []),
        "## Use it",
        "",
        "```bash",
        f"rufus-eval suite quick --ckpt {out}",
        *([f"rufus-train export {out}    # base + adapter merged once into a plain model folder: {out / MERGED_DIR}"]
          if lora and not merged else []),
        "```",
        "",
        *([("The adapter alone does not change the base model: load the merged folder, or the base with the "
            f"adapter (Rufus resolves the base reference in `{ADAPTER_CONFIG}`)."), ""] if lora and not merged else []),
        *evaluation_lines(results),
        "## Training",
        "",
        f"- base model: `{base}`",
        f"- trainable parameters: {summary['trainable_params']:,} of {summary['total_params']:,}",
        *template_lines(summary),
        *([f"- final training loss: {loss:.4g}"] if isinstance(loss, (int, float)) else []),
        *([f"- diverged at step {diverged['step']}: {diverged['metric']} {diverged['value']}"] if diverged else []),
        *([f"- weight update: ||dW||/||W|| = {summary['weight_update']['relative']:.3g}"] if summary.get("weight_update") else []),
        *dead_group_lines(summary.get("dead_groups")),
        *([f"- **warning:** {summary['warning']}"] if summary.get("warning") and not diverged
          and not summary.get("stopped") else []),
        f"- time: {summary['seconds']} s",
        f"- versions: {', '.join(f'{k} {v}' for k, v in (summary.get('versions') or {}).items())}",
        "",
        (f"The resolved stage config is `{CONFIG_YAML}`, the metrics of every logged step `{METRICS}`, the logs "
         f"`{TRAIN_LOG}`, the summary `{RUN_JSON}` (with the data's lineage: what it was made from and which "
         "benchmarks it was checked against)."),
        "",
    ]
    return ModelCard(f"---\n{metadata.to_yaml()}\n---\n\n" + "\n".join(lines)).content


def template_lines(summary: dict) -> list[str]:
    """The chat template saved with the model (where it came from) and the tokens that trained."""
    template, loss = summary.get("chat_template"), summary.get("loss_mask")
    lines = []
    if template:
        given = "the base model's own" if template["source"] == "model" else f"set by the stage (`{template['source']}`)"
        lines.append(f"- chat template: {template['name']}, {given}; saved with the model")
    if loss:
        lines.append(f"- loss on assistant tokens, found by: {loss['route']}")
    return lines


def dead_group_lines(record: dict | None) -> list[str]:
    """A GRPO run's measured reward signal (run.json's `dead_groups`)."""
    if not record:
        return []
    reward = "-" if record.get("reward_mean") is None else f"{record['reward_mean']:.4g}"
    return [(f"- rewards: mean {reward}; groups whose completions all scored the same (no advantage): "
             f"{record['dead_share_mean']:.0%} on average, every group in {len(record['dead_steps'])} of "
             f"{record['steps']} logged steps")]


def evaluation_lines(results: list[EvalResult]) -> list[str]:
    if not results:
        return []
    rows = [f"| {r.dataset_name} | {r.metric_type} | {r.metric_value:.4g} |" for r in results]
    step = results[0].metric_name.rsplit("step ", 1)[-1].rstrip(")")
    return ["## Evaluation", "", f"The last checkpoint evaluation (step {step}, `{EVAL_LOGS}/`):", "",
            "| task | metric | value |", "| --- | --- | ---: |", *rows, ""]


def write_model_card(out: Path, summary: dict, merged: bool = False) -> Path:
    path = out / MODEL_CARD
    path.write_text(redact_text(model_card(out, summary, merged)))  # a card is pushed: no credential in its URLs
    return path
