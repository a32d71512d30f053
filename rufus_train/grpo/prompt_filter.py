"""`filter:` in a GRPO stage: before it trains, the stage samples k completions of its own
starting model per prompt with `rufus-data filter` (rufus_data/rollouts/filter.py), scores them
with the stage's rewards and trains only on the chosen buckets (default: learnable, the prompts
whose samples both pass and fail). A group whose rewards are all equal gives no GRPO gradient, so
"filter, then RL" is the recipe's order (000: learnability filtering), here in one command.

The filter's output folder is keyed by what decides its rollouts (the policy and its weights,
the data's content, the rewards and the sampling): a rerun with the same settings reuses it, a
changed one gets a folder of its own. It lives beside the run folder (`<runs>/filtered/`), so an
`--overwrite` of the run keeps it. The run's lineage names it and the buckets trained on."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from rufus_data.base.console import console
from rufus_data.base.errors import RufusError
from rufus_data.folders.lineage import folder_lineage
from rufus_data.folders.run_folder import write_lineage
from rufus_data.folders.shards import MANIFEST, folder_fingerprint, read_manifest, shard_files
from rufus_data.models.merged_model import plain_folder
from rufus_data.models.reference import ModelRef
from rufus_data.rewards import parse_spec
from rufus_data.rollouts.filter import BUCKETS, EXTRA_BUCKETS, filter_prompts
from rufus_train.grpo.config import SHAPING_REWARDS
from rufus_train.grpo.filter_settings import FILTERED_DIR


def filter_config(config) -> dict:
    """The `rufus-data filter` settings of the stage (FilterConfig's fields): its starting model as
    the policy, its own rewards (none: each row's own), its sampling and seed."""
    settings = config.filter
    rewards = [] if config.reward_model else [s for s in config.rewards if parse_spec(s)[0] not in SHAPING_REWARDS]
    return {"policy": config.model, "reward": rewards, "k": settings.k, "keep": settings.keep,
            "max_tokens": settings.max_tokens or config.max_completion_length,
            "temperature": config.temperature if settings.temperature is None else settings.temperature,
            "limit": settings.limit, "seed": config.seed, "backend": settings.backend}


def policy_fingerprint(ref: ModelRef) -> Any:
    """The starting model as far as its samples go: a built-in or hub id by name, a folder by its
    weight files (name, size, modification time), an adapter with its base."""
    if ref.kind in ("builtin", "hub"):
        return ref.portable
    files = sorted(p for p in Path(ref.path).iterdir() if p.suffix in (".safetensors", ".bin") and p.is_file())
    weights = {p.name: [p.stat().st_size, p.stat().st_mtime_ns] for p in files}
    return {"path": ref.portable, "weights": weights, "base": policy_fingerprint(ref.base) if ref.base else None}


def filter_key(settings: dict, ref: ModelRef, folders: list[str]) -> str:
    """What makes two filters' outputs interchangeable: the policy's weights, the settings, the
    input shards by content (not their paths)."""
    inputs = [sorted(folder_fingerprint(f, shard_files(f))["files"].items()) for f in folders]
    key = {"settings": {k: v for k, v in settings.items() if k != "policy"}, "policy": policy_fingerprint(ref),
           "inputs": inputs}
    return hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:12]


def filter_out(config, key: str) -> Path:
    root = Path(config.filter.folder) if config.filter.folder else Path(config.output_dir).parent / FILTERED_DIR
    return root / f"{config.stage}-{key}"


def filter_stage_data(config, folders: list[str], run_dir: Path, lineage: dict) -> tuple[list[str], dict]:
    """Filter the stage's mixed data with its starting model (or reuse an earlier filter of the
    same settings); returns the chosen bucket folders and the lineage that names them (also
    written to RUN/lineage.json). No prompt kept: RufusError with the measured bucket counts."""
    settings = filter_config(config)
    ref = ModelRef.of(config.model)
    out = filter_out(config, filter_key(settings, ref, folders))
    reused = (out / MANIFEST).is_file()
    if reused:
        console.print(f"filter: reusing {out} (the same starting model, data, rewards and sampling)", highlight=False)
    else:
        console.print(f"filter: {settings['k']} samples per prompt of {ref.describe()} into {out}", highlight=False)
        policy = plain_folder(ref) if ref.is_adapter else config.model  # an adapter is sampled merged
        filter_prompts(folders, out, {**settings, "policy": policy}, show_progress=True)
    manifest = read_manifest(out)
    counts = manifest.get("counts") or {}
    chosen = {bucket: counts.get(bucket, 0) for bucket in config.filter.buckets}
    if not sum(chosen.values()):
        raise RufusError(no_rows_message(config, counts, manifest.get("prompts", 0), out))
    kept = [str(out / bucket) for bucket, rows in chosen.items() if rows]
    summary = {"out": str(out), "reused": reused, "policy": ref.portable, "k": settings["k"], "keep": settings["keep"],
               "buckets": list(chosen), "counts": counts, "rows": sum(chosen.values()),
               "config_hash": manifest.get("config_hash"), "data": lineage.get("data")}
    entries = [{"entry": folder, "name": f"{out.name}/{Path(folder).name}", "catalog": None, "shipped": False,
                "folder": folder_lineage(folder)} for folder in kept]
    lineage = {**lineage, "data": entries, "filter": summary}
    write_lineage(run_dir, lineage)
    console.print(f"filter: {bucket_text(counts)} of {manifest.get('prompts', 0)} prompts; training on "
                  f"{' + '.join(f'{b} ({n})' for b, n in chosen.items())} from {out}", highlight=False)
    return kept, lineage


def bucket_text(counts: dict) -> str:
    """`all_pass 2, learnable 3, all_fail 1` (and the other buckets where they hold rows), in the filter's order."""
    return ", ".join(f"{bucket} {counts.get(bucket, 0)}" for bucket in BUCKETS + EXTRA_BUCKETS
                     if counts.get(bucket) or bucket in BUCKETS[:3])


def no_rows_message(config, counts: dict, prompts: int, out: Path) -> str:
    """Why nothing is left to train on, from the measured buckets, and what to do."""
    buckets = ", ".join(config.filter.buckets)
    advice = []
    if counts.get("all_fail"):
        advice.append("all_fail: the prompts are too hard for this model: give easier data, start from a stronger "
                      "model (SFT first), or a longer max_completion_length if answers were cut")
    if counts.get("all_pass"):
        advice.append("all_pass: too easy: give harder data")
    if counts.get("unscored"):
        advice.append("unscored: the reward scored no sample (a missing gold answer or tests): check `rewards:` "
                      "against the data's columns")
    return (f"stage {config.stage}: the filter left 0 prompts in {buckets} to train on: of {prompts} prompts, "
            f"{config.filter.k} samples each of {config.model}: {bucket_text(counts)} ({out}/report.md). "
            f"{'; '.join(advice) or 'Raise filter.k or widen filter.keep'}. A rerun with the same settings reuses "
            f"{out}.")
