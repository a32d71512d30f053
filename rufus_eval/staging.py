"""Staging checkpoints for evaluation while training runs: what an evaluator can load, safe from
`save_total_limit` rotation, removed once evaluated.

- `stage_checkpoint`: hard links (`os.link`) of a checkpoint's weights, tokenizer and configs (no
  optimizer, scheduler, RNG state) into `<output_dir>/_eval_staging/checkpoint-N`; across file
  systems it copies, with a warning.
- A sharded checkpoint holds no loadable weights: FSDP's SHARDED_STATE_DICT writes
  `pytorch_model_fsdp_0/` (torch.distributed.checkpoint), DeepSpeed ZeRO-3 without
  `zero3_save_16bit_model` writes `global_stepN/` partitions. Those folders are linked too, and
  `consolidate` turns them into `model.safetensors` (or, for a LoRA run, `adapter_model.safetensors`)
  in the staging copy before the evaluation starts, in the evaluation's own process
  (`python -m rufus_eval.staging STAGED -- COMMAND...` consolidates, then execs COMMAND), so the
  trainer never waits for it. The config, generation config, tokenizer and adapter config such a
  checkpoint lacks are written by the callback from the live model (rank 0, no collective).
- `staging_usage`: the bytes a staged folder holds, and how many of them only it holds (files no
  checkpoint links to any more, merged LoRA copies, consolidated weights): the disk its removal frees.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import warnings
from pathlib import Path

from rufus_data.base.console import console
from rufus_data.base.errors import RufusError
from rufus_data.base.paths import link_or_copy
from rufus_data.folders.run_folder import (
    ADAPTER_CONFIG,
    ADAPTER_WEIGHTS,
    FSDP_SHARDED_PREFIX,
    MODEL_WEIGHTS,
    TRAINING_STATE_FILES,
    TRAINING_STATE_PREFIXES,
    WEIGHT_PATTERNS,
    ZERO_LATEST,
    ZERO_PREFIX,
)


def has_weights(folder: Path) -> bool:
    return any(any(folder.glob(pattern)) for pattern in WEIGHT_PATTERNS)


def sharded_kind(folder: Path) -> str | None:
    """"fsdp" or "deepspeed" when `folder` holds only sharded weights, else None."""
    if has_weights(folder):
        return None
    if any(p.is_dir() for p in folder.glob(f"{FSDP_SHARDED_PREFIX}*")):
        return "fsdp"
    if any(p.is_dir() for p in folder.glob(f"{ZERO_PREFIX}*")):
        return "deepspeed"
    return None


def stage_checkpoint(src: Path, dst: Path) -> str:
    """Hard-link the files evaluation needs from `src` into `dst` (the sharded weight folders too
    when the checkpoint has no other weights); copy across file systems. Returns "link" or "copy"."""
    tmp = dst.with_name(dst.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    sharded = sharded_kind(src)
    modes = set()
    for item in sorted(src.iterdir()):
        if item.is_dir():
            keep = (sharded == "fsdp" and item.name.startswith(FSDP_SHARDED_PREFIX)) or (
                sharded == "deepspeed" and item.name.startswith(ZERO_PREFIX))
            if keep:
                for file in sorted(p for p in item.rglob("*") if p.is_file()):
                    target = tmp / item.name / file.relative_to(item)
                    target.parent.mkdir(parents=True, exist_ok=True)
                    modes.add(link_or_copy(file, target))
            continue
        if item.name in TRAINING_STATE_FILES or item.name.startswith(TRAINING_STATE_PREFIXES):  # not evaluated
            continue
        modes.add(link_or_copy(item, tmp / item.name))
    shutil.rmtree(dst, ignore_errors=True)
    tmp.rename(dst)
    if "copy" in modes:
        warnings.warn(
            f"staging {src} -> {dst}: hard links failed (different file systems?), the checkpoint was copied",
            stacklevel=2,
        )
        return "copy"
    return "link"


def write_model_files(staged: Path, model, tokenizer=None, base_model: str | None = None) -> None:
    """What a sharded checkpoint lacks and evaluation needs, from the live model (no collective):
    config.json (+ generation_config.json), the tokenizer, and for a LoRA model adapter_config.json
    (its base: `base_model`, the run's starting model, when given)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    base.config.save_pretrained(staged)
    if getattr(base, "generation_config", None) is not None:
        base.generation_config.save_pretrained(staged)
    if tokenizer is not None:
        tokenizer.save_pretrained(staged)
    for name, peft_config in (getattr(model, "peft_config", None) or {}).items():
        if name != "default":
            continue
        peft_config.save_pretrained(staged)
        if base_model:
            path = staged / ADAPTER_CONFIG
            data = json.loads(path.read_text())
            data["base_model_name_or_path"] = base_model
            path.write_text(json.dumps(data, indent=2))


def consolidate(staged: Path) -> str | None:
    """Turn a staged sharded checkpoint into loadable weights (kept beside the shards, which are
    then removed from the staging copy). Returns the kind consolidated, or None when nothing was
    sharded."""
    kind = sharded_kind(staged)
    if kind is None:
        return None
    state = _load_fsdp_sharded(staged) if kind == "fsdp" else _load_zero_partitions(staged)
    adapter = (staged / ADAPTER_CONFIG).exists()
    if adapter:
        # PEFT's saved names: the adapter's name (".default") dropped, as save_pretrained writes them
        state = {k.replace(".default", ""): v for k, v in state.items() if "lora_" in k}
    if not state:
        raise RufusError(f"{staged}: the {kind} shards hold no {'LoRA ' if adapter else ''}weights to consolidate")
    from safetensors.torch import save_file  # heavy: torch loads with it

    name = ADAPTER_WEIGHTS if adapter else MODEL_WEIGHTS
    save_file({k: v.contiguous() for k, v in state.items()}, str(staged / (name + ".tmp")), metadata={"format": "pt"})
    (staged / (name + ".tmp")).rename(staged / name)
    for folder in staged.iterdir():
        if folder.is_dir() and folder.name.startswith((FSDP_SHARDED_PREFIX, ZERO_PREFIX)):
            shutil.rmtree(folder)
    console.print(f"consolidated the {kind} shards of {staged} into {name} ({len(state)} tensors)")
    return kind


def _load_fsdp_sharded(staged: Path) -> dict:
    """The full state dict of accelerate's SHARDED_STATE_DICT folder, read in one process."""
    import torch  # heavy: only to consolidate shards
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    folders = sorted(p for p in staged.glob(f"{FSDP_SHARDED_PREFIX}*") if p.is_dir())
    if len(folders) != 1:
        raise RufusError(f"{staged}: expected one {FSDP_SHARDED_PREFIX}N folder, found {[p.name for p in folders]}")
    merged = staged / "consolidated.pt.tmp"
    try:
        dcp_to_torch_save(folders[0], merged)
        state = torch.load(merged, map_location="cpu", weights_only=True)
    finally:
        merged.unlink(missing_ok=True)
    return state.get("model", state)  # accelerate saves {"model": state_dict}


def _load_zero_partitions(staged: Path) -> dict:
    """The fp32 state dict of DeepSpeed ZeRO partitions (deepspeed's own zero_to_fp32 reader)."""
    try:  # heavy, and only on CUDA machines
        from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint
    except ImportError:
        raise RufusError(
            f"{staged} holds DeepSpeed ZeRO partitions only: consolidating them needs the deepspeed package "
            "(`pip install deepspeed`), or save gathered weights with zero3_save_16bit_model: true "
            "(catalogs/accelerate/zero3.yaml does)"
        ) from None
    tag = (staged / ZERO_LATEST).read_text().strip() if (staged / ZERO_LATEST).exists() else None
    return get_fp32_state_dict_from_zero_checkpoint(str(staged), tag=tag)


def staging_usage(staged: Path) -> dict:
    """Bytes in a staged folder, and the bytes only it holds (files with no other hard link)."""
    total = only_here = 0
    for path in staged.rglob("*"):
        if path.is_file() and not path.is_symlink():
            info = path.stat()
            total += info.st_size
            if info.st_nlink == 1:
                only_here += info.st_size
    return {"bytes": total, "only_here_bytes": only_here}


def main(argv: list[str] | None = None) -> None:  # pragma: no cover - exercised by the callback's child process
    """`python -m rufus_eval.staging STAGED -- COMMAND ...`: consolidate STAGED, then exec COMMAND."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) < 3 or argv[1] != "--":
        raise SystemExit("usage: python -m rufus_eval.staging STAGED -- COMMAND ...")
    try:
        consolidate(Path(argv[0]))
    except RufusError as err:
        console.print(f"[red]error:[/] {err}")
        raise SystemExit(2) from None
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(argv[2], argv[2:])


if __name__ == "__main__":
    main()
