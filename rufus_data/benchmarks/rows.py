"""A benchmark's rows: the one reader of registry benchmarks. A set loads path -> local -> hub
through the shared loader (rufus_data.dataset_source) and is converted (convert.py); BFCL reads
the bfcl-eval wheel (bfcl.py). DatasetUnavailable, naming every place tried, when none loads.

RULER's haystacks are files, not rows: `haystack_files` finds the copies `data pull` kept under
$RUFUS_DATA_ROOT."""

from __future__ import annotations

from pathlib import Path

from rufus_data.benchmarks.bfcl import bfcl_rows
from rufus_data.benchmarks.convert import convert_rows
from rufus_data.benchmarks.registry import DEFAULT_REGISTRY, BenchmarkSpec, benchmark_spec
from rufus_data.dataset_source import DatasetUnavailable, IdRange, LoadedRows, load_rows
from rufus_data.errors import RufusError
from rufus_data.paths import data_root
from rufus_data.rewards.bfcl import wheel_path
from rufus_data.shards import file_sha256


def locate(name: str, spec: BenchmarkSpec, registry_path: Path = DEFAULT_REGISTRY, what: str | None = None) -> LoadedRows:
    """The rows of one benchmark (its `id_range` applied) and where they came from, through the shared
    loader: `path`, then `local`, then `hub`. DatasetUnavailable (naming every place tried) when none loads;
    `what` names the reader in messages (default: the benchmark)."""
    if spec.wheel:
        raise RufusError(f"benchmark `{name}` comes from the wheel {spec.wheel}: read it with benchmark_rows")
    source = spec
    if spec.id_range:
        if not isinstance(spec.id_field, str):
            raise RufusError(f"benchmark `{name}`: id_range needs a single integer `id_field`; fix it in {registry_path}")
        source = spec.model_copy(update={"ids": IdRange(field=spec.id_field, within=[tuple(spec.id_range)])})
    return load_rows(source, what or f"benchmark `{name}`", base=registry_path.parent,
                     pin_hint=f" in {registry_path.name}")


def benchmark_rows(name: str, what: str | None = None) -> tuple[list[dict], dict]:
    """(converted rows, provenance) of a registry benchmark; DatasetUnavailable when none of its places loads."""
    spec, registry_path = benchmark_spec(name)
    what = what or f"benchmark `{name}`"
    if spec.wheel:
        try:
            wheel = wheel_path(spec.wheel)
        except RufusError as err:
            raise DatasetUnavailable(f"{what}: the wheel {spec.wheel} is not here: {err}") from None
        digest = file_sha256(wheel)
        provenance = {"origin": "wheel", "from": str(wheel), "wheel": spec.wheel, "category": spec.category,
                      "sha256": digest, "fingerprint": f"sha256:{digest}"}
        return bfcl_rows(spec.wheel, spec.category), provenance
    try:
        loaded = locate(name, spec, registry_path, what)
    except DatasetUnavailable as err:
        gated = (f" {spec.hub.id} is gated: accept its terms on https://huggingface.co/datasets/{spec.hub.id} "
                 "and set HF_TOKEN to a token of that account." if spec.gated and spec.hub else "")
        raise DatasetUnavailable(f"{err}.{gated}") from None
    rows = list(convert_rows(spec.convert, loaded.rows))
    return rows, {**loaded.provenance, **({"converted": spec.convert} if spec.convert else {})}


def haystack_files(spec: BenchmarkSpec) -> dict[str, Path]:
    """The haystacks `data pull` kept under $RUFUS_DATA_ROOT (only those that are there)."""
    root = data_root(required=False)
    if root is None:
        return {}
    return {name: root / h.local for name, h in spec.haystacks.items() if (root / h.local).is_file()}
