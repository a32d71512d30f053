"""Mixture catalogs: which sources, in which canonical shape, at which token share.

A catalog is YAML validated strictly (unknown keys are errors with file, line and the nearest
valid key). Shares are fractions of tokens and must sum to 1."""

from __future__ import annotations

import hashlib
import math
import os
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from rufus_data.base.errors import RufusError
from rufus_data.base.yaml_config import StrictModel, load_yaml_model, settings_model
from rufus_data.folders.shards import Kind
from rufus_data.rewards.data_rewards import Spec as RewardSpec
from rufus_data.rewards.data_rewards import normalise_specs
from rufus_data.sources.builders import BUILDERS
from rufus_data.sources.dataset_source import DatasetSource
from rufus_data.sources.source_formats import DECLARED_FORMATS

Format = Literal[("auto", *DECLARED_FORMATS)]  # rufus_data/sources/source_formats.py
SHARE_TOLERANCE = 1e-6


class SourceRows(DatasetSource):
    """Where a source's rows come from (`path`, `local`, `hub`: rufus_data.sources.dataset_source), an
    optional builder step that makes its training rows from them (rufus_data.sources.builders), and how
    the rows read (`format`, `fields`)."""

    build: str | None = Field(default=None, description="a builder step of rufus_data.sources.builders")
    format: Format = "auto"
    fields: dict[str, str] = Field(default_factory=dict, description="canonical field -> column in the source")
    label: str | None = None

    @field_validator("build")
    @classmethod
    def _known_builder(cls, value: str | None) -> str | None:
        if value is not None and value not in BUILDERS:
            raise ValueError(f"unknown builder {value!r}; the builders are: {', '.join(sorted(BUILDERS))}")
        return value

    @model_validator(mode="before")
    @classmethod
    def _hub_keys_inside_hub(cls, data: Any) -> Any:
        if isinstance(data, dict) and {"config", "split", "revision"} & set(data):
            raise ValueError("`config`, `split` and `revision` go inside `hub:` "
                             "(hub: {id: ORG/NAME, config: ..., split: ..., revision: COMMIT})")
        return data


class SourceSpec(SourceRows):
    """One source of a mixture: where its rows come from, what stands in when they cannot load
    (`fallback:`, e.g. the closest data under $RUFUS_DATA_ROOT), and how many tokens it gets."""

    name: str
    share: float = Field(strict=True, gt=0, le=1, description="fraction of the budget's tokens, a number (0.25, not \"0.25\")")
    system: str | None = None
    max_tokens_per_example: int | None = Field(default=None, gt=0)
    strip_past_reasoning: bool = True
    upsample: bool = False
    holdout: int | None = Field(default=None, ge=0)
    fallback: SourceRows | None = None
    reward: RewardSpec | list[RewardSpec] | None = Field(
        default=None, description="rl sources: the reward that scores this source's rows (a registry spec or a list), "
        "written into each row for filter, pairs and the RL stages (rufus_data/rewards/data_rewards.py)")

    @field_validator("reward")
    @classmethod
    def _known_reward(cls, value):
        try:
            normalise_specs(value)  # checked against the rewards registry
        except RufusError as err:
            raise ValueError(str(err)) from None
        return value

    @model_validator(mode="after")
    def _some_origin(self) -> SourceSpec:
        for rows, where in ((self, ""), (self.fallback, "fallback of ")):
            if rows is not None and rows.written_origin() is None:
                raise ValueError(f"{where}source '{self.name}' needs `path:` (a file), `local:` (a path under "
                                 "$RUFUS_DATA_ROOT) or `hub:` {id, config, split, revision}")
        return self

    @property
    def default_label(self) -> str:
        return self.label or self.written_origin() or self.name


class MixtureCatalog(StrictModel):
    """A token-share mixture (see catalogs/sft.yaml for a commented example)."""

    kind: Kind
    name: str
    tokenizer: str = "smollm2-135m"
    chat_template: str | None = None
    seed: int = 0
    budget: int | None = Field(default=None, gt=0, description="tokens on `basis`; default: the most the sources allow")
    basis: Literal["total", "trainable"] = "total"
    shard_rows: int = Field(default=50_000, gt=0)
    holdout: int = Field(default=0, ge=0, description="rows per source held out (a source's own `holdout` wins)")
    on_bad_row: Literal["error", "skip"] = Field(
        default="error", description="rows that lack what their format needs: stop, or drop and count them (--on-bad-row wins)")
    sources: list[SourceSpec] = Field(min_length=1)

    @model_validator(mode="after")
    def _check_sources(self) -> MixtureCatalog:
        rewarded = [s.name for s in self.sources if s.reward is not None]
        if rewarded and self.kind != "rl":
            raise ValueError(f"`reward:` is for sources of an rl catalog (RL prompts), but this one is kind {self.kind}: "
                             f"drop it from {', '.join(rewarded)}")
        names = [s.name for s in self.sources]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"source names must be unique, repeated: {dupes}")
        total = math.fsum(s.share for s in self.sources)
        if abs(total - 1.0) > SHARE_TOLERANCE:
            detail = " + ".join(f"{s.name}={s.share}" for s in self.sources)
            raise ValueError(f"shares must sum to 1, they sum to {total:.6g} ({detail})")
        return self


def load_catalog(path: str | Path) -> MixtureCatalog:
    """Read and validate a mixture catalog; relative source paths resolve against the catalog's
    folder. Labels default to the origin as written (a fallback's own, unless the source sets one)."""
    path = Path(path)
    return _settled(load_yaml_model(path, MixtureCatalog), path.parent)


def catalog_from_data(data: dict, base: Path) -> MixtureCatalog:
    """A catalog given from Python as a dict, validated as a file is; relative source paths
    resolve against `base` (the working folder, where a file's resolve against its folder)."""
    return _settled(settings_model(MixtureCatalog, data, where="catalog"), base)


def _settled(catalog: MixtureCatalog, base: Path) -> MixtureCatalog:
    """Labels as written and source paths resolved against `base`, once, as a mix reads them."""
    for source in catalog.sources:
        given = source.label
        source.label = source.default_label  # the path as written, before it is resolved
        if source.fallback is not None:
            source.fallback.label = source.fallback.label or given or source.fallback.written_origin()
        for rows in (source, source.fallback):
            if rows is not None and rows.path is not None:
                rows.path = str(resolve_source_path(rows.path, base))
    return catalog


def resolve_source_path(value: str, base: Path) -> Path:
    """`path:` values: absolute, relative to the catalog, or `$RUFUS_DATA_ROOT/...`."""
    expanded = os.path.expandvars(os.path.expanduser(value))
    if "$" in expanded:
        raise RufusError(f"source path {value} uses an unset environment variable: set it or give a plain path")
    candidate = Path(expanded)
    if not candidate.is_absolute():
        candidate = (base / candidate).resolve()
    return candidate


def catalog_hash(path: str | Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()
