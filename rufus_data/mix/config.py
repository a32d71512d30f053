"""The settings of one `rufus-data mix` run beside its catalog: `MixConfig`, what the run is asked
beside the catalog (what `mix()` takes as its settings), and `MixCommand`, what one command line
reads and writes. The command's options are built from both (rufus_data/base/cli_options.py), so
the CLI and the library cannot drift. This module loads nothing heavy: `rufus-data` reads it
when it starts."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field

from rufus_data.base.cli_options import DRY_RUN_HELP, Flag
from rufus_data.base.yaml_config import StrictModel

OnBadRow = Literal["error", "skip"]


class MixConfig(StrictModel):
    """What one mix run is asked beside its catalog (the catalog holds the mixture itself)."""

    holdout: int | None = Field(None, ge=0, description="rows per source held out (replaces the catalog-level "
                                "`holdout:`; a source's own `holdout:` wins)")
    on_bad_row: OnBadRow | None = Field(None, description="rows that lack what their format needs: stop and name them, "
                                        "or drop and count them (default: the catalog's `on_bad_row`, error)")


class MixCommand(StrictModel):
    """What one `rufus-data mix` reads and writes (its MixConfig apart)."""

    catalog: Annotated[Path, Flag(argument=True)] = Field(
        description="mixture catalog (YAML), e.g. catalogs/sft.yaml (read from the shipped catalogs when ./catalogs lacks it)")
    out: Path | None = Field(None, description="output folder (default: outputs/<catalog name>)")
    overwrite: bool = Field(False, description="replace an existing output folder")
    dry_run: bool = Field(False, description=f"{DRY_RUN_HELP}: the catalog's sources read and token-counted, and per "
                          "source the rows in, held out and taken, tokens, target and realised share and repeats")


def default_out(name: str) -> Path:
    """outputs/<catalog name>: where a mix goes without --out (the file's stem, else the catalog's `name`)."""
    return Path("outputs") / name
