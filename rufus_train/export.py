"""`rufus-train export RUN`: a LoRA run's adapter merged into a copy of its base, the plain
model folder inference loads. Exporting is merging (the adapter alone is already in RUN), so
there is no merge switch; `--dry_run` says what would be merged, from which base, into where,
reading only the adapter's small files."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from pydantic import Field

from rufus_data.base.cli_options import Flag
from rufus_data.base.errors import RufusError
from rufus_data.base.yaml_config import StrictModel
from rufus_data.folders.run_folder import ADAPTER_CONFIG, MERGED_DIR
from rufus_data.folders.shards import refuse_existing_output
from rufus_data.models.merged_model import is_current, merge_source
from rufus_data.models.reference import ModelRef

MERGE_NOT_NEEDED = ("--merge is no longer needed: export always merges (the adapter alone is already in RUN); "
                    "--merge still works for now")


class ExportConfig(StrictModel):
    """The options of `rufus-train export` (each field's description is its help)."""

    run: Annotated[Path, Flag(argument=True, metavar="RUN")] = Field(
        description="a run folder holding a LoRA adapter")
    out: Path | None = Field(
        None, description="also copy the merged model here (default: RUN/merged only, the copy rufus-eval uses too)")
    overwrite: bool = Field(False, description="replace an existing --out folder")


def export_plan(config: ExportConfig) -> list[str]:
    """What `export` would do, one line each, checked as the export checks it; no model loads."""
    run, adapter = config.run, ModelRef.of(config.run)
    if adapter.base is None:
        raise RufusError(f"{run} holds no LoRA adapter ({ADAPTER_CONFIG} missing): a full fine-tuning run already is "
                         "a plain model folder; load it directly")
    base, source, target = adapter.base, merge_source(adapter), run / MERGED_DIR
    lines = [f"adapter  {run} (LoRA)", f"base     {base.text} (read, never changed)"]
    if base.is_adapter:
        lines.append(f"         {base.text} is itself a LoRA run: merged first, into {Path(base.path) / MERGED_DIR}")
    if is_current(target, source):
        lines.append(f"merged   {target} is current (made from this adapter): reused, nothing merged")
    else:
        lines.append(f"merged   {target} <- the adapter merged into a copy of the base, in {source['dtype']}")
    if config.out is not None:
        refuse_existing_output(config.out, config.overwrite)
        replaces = " (replacing the folder there: --overwrite)" if config.out.exists() else ""
        lines.append(f"copy     {target} -> {config.out}{replaces}")
    return lines
