"""The run folder's model card (OUT/README.md), written from run.json when the run ends.

TRL's card names the base model only when it is a hub id: for a local folder, which every
built-in is, it reads "a fine-tuned version of [None](https://huggingface.co/None)". Rufus knows
the base reference (built-in name, hub id or folder), the stage, the data and how the weights
moved, so it writes the card itself; the checkpoints keep TRL's."""

from __future__ import annotations

from pathlib import Path

import yaml

from rufus_data.models import BUILTINS
from rufus_data.run_folder import CONFIG_YAML, METRICS, RUN_JSON, TRAIN_LOG, is_run_folder, read_run_json

CARD = "README.md"


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


def model_card(out: Path, summary: dict) -> str:
    base = summary["base_model"]
    lora = summary.get("lora")
    metadata = {
        "base_model": hub_base(base),
        "library_name": "peft" if lora else "transformers",
        "pipeline_tag": "text-generation",
        "tags": ["rufus", "trl", summary["stage"], *(["lora"] if lora else [])],
    }
    method = f"a LoRA adapter (r={lora['r']}, alpha={lora['alpha']})" if lora else "full fine-tuning"
    final = summary.get("final_metrics") or {}
    loss = final.get("train_loss", final.get("loss"))
    data = ", ".join(f"`{d}`" for d in summary.get("data") or []) or "its data"
    lines = [
        "---",
        yaml.safe_dump({k: v for k, v in metadata.items() if v is not None}, sort_keys=False).strip(),
        "---",
        "",
        f"# {out.name}",
        "",
        (f"A fine-tuned version of {base_description(base)}: Rufus stage `{summary['stage']}`, {method}, "
         f"{summary['global_step']} steps on {data}."),
        "",
        "## Use it",
        "",
        "```bash",
        f"rufus-eval suite quick --ckpt {out}",
        *([f"rufus-train export {out} --merge    # base + adapter as a plain model folder: {out}/merged"] if lora else []),
        "```",
        "",
        *([("The adapter alone does not change the base model: load the merged folder, or the base with the "
            "adapter (Rufus resolves the base reference in `adapter_config.json`)."), ""] if lora else []),
        "## Training",
        "",
        f"- base model: `{base}`",
        f"- trainable parameters: {summary['trainable_params']:,} of {summary['total_params']:,}",
        *([f"- final training loss: {loss:.4g}"] if isinstance(loss, (int, float)) else []),
        *([f"- weight update: ||dW||/||W|| = {summary['weight_update']['relative']:.3g}"] if summary.get("weight_update") else []),
        *([f"- **warning:** {summary['warning']}"] if summary.get("warning") else []),
        f"- time: {summary['seconds']} s",
        f"- versions: {', '.join(f'{k} {v}' for k, v in (summary.get('versions') or {}).items())}",
        "",
        (f"The resolved stage config is `{CONFIG_YAML}`, the metrics of every logged step `{METRICS}`, the logs "
         f"`{TRAIN_LOG}`, the summary `{RUN_JSON}` (with the data's lineage: what it was made from and which "
         "benchmarks it was checked against)."),
        "",
    ]
    return "\n".join(lines)


def write_model_card(out: Path, summary: dict) -> Path:
    path = out / CARD
    path.write_text(model_card(out, summary))
    return path
