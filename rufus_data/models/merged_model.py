"""A LoRA run folder as a plain model folder: `RUN/merged/`, the adapter merged into a copy of
its base once, then reused by everything that needs a plain model (rufus-eval suites and vibe
tests, `rufus-train export`). The base itself is never changed.

`RUN/merged/rufus-merged.json` records the adapter the copy was made from (sha256 of its
weights); an adapter trained again in place (a resumed run) gets a fresh copy. The merge runs in
the dtype the run trained in (run.json `dtype`; float32 when unknown): a bf16 copy of a run
trained in float32 would round small updates away."""

from __future__ import annotations

import json
import shutil
import warnings
from pathlib import Path

from rufus_data.base.console import console
from rufus_data.base.errors import RufusError
from rufus_data.base.paths import atomic_file
from rufus_data.folders.output_lock import OutputLock
from rufus_data.folders.run_folder import (
    ADAPTER_CONFIG,
    ADAPTER_WEIGHTS,
    MERGED_DIR,
    MERGED_FROM,
    MODEL_CONFIG,
    TOKENIZER_CONFIG,
    read_run_json,
)
from rufus_data.folders.shards import atomic_output_dir, file_sha256, refuse_existing_output
from rufus_data.models.builtin import file_lock
from rufus_data.models.embeddings import fit_for_adapter
from rufus_data.models.reference import ModelRef

# peft 0.21's PeftModel.__init__ reads transformers 5's deprecated `is_gradient_checkpointing`:
# a FutureWarning on every LoRA load that no Rufus setting can avoid (peft must rename it).
warnings.filterwarnings("ignore", message="`is_gradient_checkpointing` is deprecated", category=FutureWarning)


def set_adapter_base(folder: str | Path, reference: str) -> None:
    """Record `reference` as the base of the adapter in `folder` (a portable one: see
    ModelRef.portable); ModelRef reads it back as the adapter's `base`."""
    path = Path(folder) / ADAPTER_CONFIG
    config = json.loads(path.read_text())
    config["base_model_name_or_path"] = reference
    with atomic_file(path) as tmp:
        tmp.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def plain_folder(model: ModelRef) -> str:
    """The model as a plain folder from_pretrained loads: a built-in converted, an adapter merged
    into its one merged copy (`merged_model`)."""
    return str(merged_model(model)) if model.is_adapter else model.folder()


def merged_model(adapter: ModelRef) -> Path:
    """`ADAPTER/merged`: the adapter merged into its base, built when missing or stale. A base
    that is itself an adapter (a pipeline's earlier stage) is merged first, into its own folder."""
    if adapter.base is None:
        raise RufusError(f"{adapter.path} holds no LoRA adapter ({ADAPTER_CONFIG} missing): a full fine-tuning run "
                         "already is a plain model folder; load it directly")
    run = Path(adapter.path)
    target = run / MERGED_DIR
    with file_lock(run / f".{MERGED_DIR}.lock"):  # two evaluations of one run merge it once
        source = merge_source(adapter)
        if is_current(target, source):
            return target
        console.print(f"merging the LoRA adapter of {run} into a copy of its base {adapter.base.text} -> {target} "
                      f"({source['dtype']}; the base itself is not changed)", highlight=False, soft_wrap=True)
        _merge(run, plain_folder(adapter.base), target, source)
    return target


def merge_source(adapter: ModelRef) -> dict:
    """What a merged copy is made from: the adapter's weights, its base and the merge dtype."""
    run = Path(adapter.path)
    summary = read_run_json(run)
    weights = run / ADAPTER_WEIGHTS
    return {
        "adapter_sha256": file_sha256(weights) if weights.exists() else None,
        "base": adapter.base.text,
        "dtype": summary.get("dtype") or "float32",
    }


def is_current(target: Path, source: dict) -> bool:
    record = target / MERGED_FROM
    return (target / MODEL_CONFIG).exists() and record.exists() and json.loads(record.read_text()) == source


def copy_merged(adapter: ModelRef, out: str | Path, overwrite: bool = False) -> Path:
    """A copy of the adapter's merged model at `out` (merged first if needed); refuses an existing
    `out` unless `overwrite`, and an `out` another process writes (output_lock.py)."""
    with OutputLock(out, "rufus-train export"):
        refuse_existing_output(Path(out), overwrite)  # before the merge, which takes a while
        merged = merged_model(adapter)
        with atomic_output_dir(out, overwrite=overwrite) as tmp:
            shutil.copytree(merged, tmp, dirs_exist_ok=True)
    return Path(out)


def _merge(run: Path, base_path: str, target: Path, source: dict) -> None:
    import torch  # heavy: only when a merge actually runs
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    base = AutoModelForCausalLM.from_pretrained(base_path, dtype=getattr(torch, source["dtype"]))
    fit_for_adapter(base, run)
    model = PeftModel.from_pretrained(base, str(run)).merge_and_unload()
    tokenizer_source = run if (run / TOKENIZER_CONFIG).exists() else Path(base_path)
    with atomic_output_dir(target, overwrite=True) as tmp:  # a stale copy is replaced, never half-written
        model.save_pretrained(tmp, safe_serialization=True)
        AutoTokenizer.from_pretrained(str(tokenizer_source)).save_pretrained(tmp)
        (tmp / MERGED_FROM).write_text(json.dumps(source, indent=2) + "\n")
