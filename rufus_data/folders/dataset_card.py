"""The dataset card (README.md) of an output folder, so `datasets.load_dataset(OUT)` returns
what the step means and a reader of the dataset on the Hub sees where its rows came from.

The card's `configs:` name files, not globs: `datasets` cannot read a split whose only file has
no rows ("BatchSize must be greater than 0"), nor return an empty split, so empty files and
empty splits are left out of the configs and named in the card's text instead. A folder of
shards has one config, `default`, with a split per shard name (train, holdout, ...); a folder
of shard folders (filter's buckets) has one config per non-empty folder, `learnable` the
default; a side table beside the data (rollouts, contaminated, clusters) is a config of its own.
The text holds the sources and their shares, the lineage (rufus_data/folders/lineage.py), what the
data was checked against, the command that made it and the versions."""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

import pyarrow.parquet as pq
from huggingface_hub import DatasetCard, DatasetCardData

from rufus_data.base.redaction import redact_text  # a card is pushed: no credential in its URLs
from rufus_data.folders.lineage import MIX, chain_text, checked_benchmarks, decontam_steps, folder_lineage
from rufus_data.folders.shards import DATA_DIR, read_manifest, split_files

CARD = "README.md"
DEFAULT_BUCKET = "learnable"  # filter's prompts to train on
CLI_NAMES = ("rufus-data", "rufus-train", "rufus-eval")
TASKS = {"sft": "text-generation", "rl": "text-generation", "preference": "text-generation"}


def file_rows(path: Path) -> int:
    return pq.read_metadata(path).num_rows


def split_data_files(folder: Path, prefix: str = "") -> tuple[list[dict], dict[str, int]]:
    """The `data_files` of a shard folder (each non-empty split with its non-empty files) and the
    rows of every split, empty ones included."""
    data_files, rows = [], {}
    for split, files in split_files(folder).items() if (folder / DATA_DIR).is_dir() else ():
        counted = [(path, file_rows(path)) for path in files]
        rows[split] = sum(n for _, n in counted)
        paths = [f"{prefix}{DATA_DIR}/{path.name}" for path, n in counted if n]
        if paths:
            data_files.append({"split": split, "path": paths})
    return data_files, rows


def card_configs(folder: Path) -> tuple[list[dict], dict[str, dict[str, int]]]:
    """The configs of the folder's card and the rows of each config's splits (as written)."""
    configs, rows = [], {}
    if (folder / DATA_DIR).is_dir():
        data_files, rows["default"] = split_data_files(folder)
        configs.append({"config_name": "default", "data_files": data_files or [{"split": "train", "path": []}]})
    else:
        for inner in sorted(path for path in folder.iterdir() if (path / DATA_DIR).is_dir()):
            data_files, rows[inner.name] = split_data_files(inner, f"{inner.name}/")
            if data_files:
                configs.append({"config_name": inner.name, "data_files": data_files})
    for table in sorted(folder.glob("*.parquet")):
        rows[table.stem] = {"train": file_rows(table)}
        if rows[table.stem]["train"]:
            configs.append({"config_name": table.stem, "data_files": [{"split": "train", "path": table.name}]})
    names = [config["config_name"] for config in configs]
    default = "default" if "default" in names else DEFAULT_BUCKET if DEFAULT_BUCKET in names else None
    for config in configs:
        if config["config_name"] == default:
            config["default"] = True
    configs.sort(key=lambda config: not config.get("default"))
    return [c for c in configs if c["data_files"][0]["path"] or c.get("default")], rows


def command_line(command: str) -> str:
    """The command as typed when a Rufus CLI runs this process; else the step's name."""
    program = Path(sys.argv[0]).name if sys.argv else ""
    return shlex.join([program, *sys.argv[1:]]) if program in CLI_NAMES else f"{command} (called from Python)"


def lineage_node(folder: Path) -> dict:
    """The folder's lineage node, read from its manifest (a folder of shard folders has no shards
    of its own to fingerprint: an empty recorded fingerprint reads the manifest all the same)."""
    return folder_lineage(folder, {"path": str(folder), "files": {}})


def mixed_manifest(node: dict) -> dict:
    """The manifest of the nearest mix in the lineage ({} when there is none)."""
    if node.get("command") == MIX:
        return read_manifest(node["path"])
    for item in node.get("inputs") or []:
        if item.get("on_disk", "same") == "same" and (found := mixed_manifest(item)):
            return found
    return {}


def tokens_column(basis: str) -> str:
    """The header of a mix's per-source token count, naming what it counts (the mix's basis:
    `trainable tokens`, what the loss sees, or `total tokens`): one name and one number in the mix
    table, its report and the dataset card."""
    return f"{basis} tokens"


def markdown_table(header: list[str], rows: list[list]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    return "\n".join([*lines, *("| " + " | ".join(str(cell) for cell in row) + " |" for row in rows)]) + "\n"


def card_text(title: str, manifest: dict, configs: list[dict], rows: dict, node: dict) -> str:
    command = manifest.get("command") or "rufus-data"
    listed = {config["config_name"]: config for config in configs}
    default = next((name for name, config in listed.items() if config.get("default")), None)
    lines = [f"# {title}", "", f"Written by `{command}` (Rufus). `datasets.load_dataset(OUT)` (this folder, or the "
             "Hub repo it was pushed to) " + (f"returns the `{default}` config" if default else "needs a config name")
             + "; the others by name.", "", "## Configs", ""]
    table = []
    for name, splits in rows.items():
        for split, count in splits.items():
            note = "" if count else "empty: left out of the configs (datasets cannot load an empty split)"
            table.append([f"`{name}`" + (" (default)" if name == default else ""), split, f"{count:,}", note])
    lines += [markdown_table(["config", "split", "rows", "note"], table)]
    mixed = mixed_manifest(node)
    sources = mixed.get("sources") or []
    if sources:
        lines += ["## Sources and shares", "", ("As mixed" + ("" if node.get("command") == MIX else
                  " (before the later steps below removed rows)") + ":"), ""]
        lines.append(markdown_table(
            ["source", "rows", "share requested", "share realised", tokens_column(mixed.get("basis", "total"))],
            [[s.get("name"), f"{s.get('rows_out', 0):,}", s.get("share_requested"), s.get("share_realised"),
              f"{(s.get('tokens') or {}).get('basis', 0):,}"] for s in sources]))
    lines += ["## Lineage", "", f"`{chain_text(node)}`", "", "## Decontamination", ""]
    checked = checked_benchmarks(node)
    if checked:
        steps = decontam_steps(node)
        lines += [f"Every row was checked against {len(checked)} benchmark(s) by {len(steps)} decontam step(s):", "",
                  markdown_table(["benchmark", "rows removed"], [[name, f"{n:,}"] for name, n in checked.items()])]
    else:
        lines += [("No decontam step checked these rows against a benchmark: run `rufus-data decontam` before "
                   "training on them for an evaluation you mean to trust."), ""]
    lines += ["## How it was made", "", "```", command_line(command), "```", "",
              f"Config hash `{manifest.get('config_hash')}`; counts: `{json.dumps(manifest.get('counts'), sort_keys=True)}`.",
              "", markdown_table(["package", "version"], sorted((manifest.get("versions") or {}).items())),
              "`manifest.json` holds every setting and the fingerprint of every input; `report.md` what to read first.", ""]
    return "\n".join(lines)


def write_dataset_card(folder: str | Path, manifest: dict, out_name: str) -> Path:
    """Write README.md into an output folder (its data, side tables and manifest already there)."""
    folder = Path(folder)
    configs, rows = card_configs(folder)
    title = f"{out_name}/{manifest['bucket']}" if manifest.get("bucket") else out_name
    data = DatasetCardData(
        pretty_name=title, configs=configs, tags=["rufus", *([manifest["kind"]] if manifest.get("kind") else [])],
        task_categories=[TASKS[manifest["kind"]]] if manifest.get("kind") in TASKS else None,
    )
    text = card_text(title, manifest, configs, rows, lineage_node(folder))
    card = DatasetCard(redact_text(f"---\n{data.to_yaml()}\n---\n\n{text}"))
    card.save(folder / CARD)
    return folder / CARD
