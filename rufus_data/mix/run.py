"""`rufus-data mix`: build a token-balanced mixture from a catalog.

Each source is read once, canonicalised and token-counted in batches (canonical rows go to
temporary parquet parts, only the counts stay in memory). Rows are then chosen per source,
deterministically from the seed, so that each source's share of the tokens (not of the rows)
matches its `share`: a small source with long answers gets its token share (selection.py, the
passes its --dry-run plan shares). The mixture is shuffled, written as parquet shards with a
manifest and a report, and only then moved into place."""

from __future__ import annotations

import hashlib
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from rufus_data.base.report import bar_chart, markdown_table
from rufus_data.base.yaml_config import settings_model
from rufus_data.folders.dataset_card import tokens_column
from rufus_data.folders.output_step import OutputStep, StepResult
from rufus_data.folders.shards import write_shards
from rufus_data.mix.config import MixConfig, default_out
from rufus_data.mix.selection import (
    CatalogRead,
    count_and_select,
    open_sources,
    read_catalog,
    share_notes,
    source_summaries,
)
from rufus_data.mix.shuffled_shards import read_picked_holdout, unified_schema, write_train
from rufus_data.sources.catalog import MixtureCatalog
from rufus_data.sources.inputs import DataInput


def mix(inputs: str | Path | dict | MixtureCatalog, out: str | Path | None = None,
        settings: MixConfig | dict | str | Path | None = None, *, overwrite: bool = False,
        show_progress: bool = False) -> StepResult:
    """Build the mixture a catalog describes (`inputs`: its file, or the catalog as a dict or a
    MixtureCatalog) into `out` (None: outputs/<catalog name>); `settings`: MixConfig, or a dict or
    YAML file of its fields. A relative `catalogs/...` path the working folder lacks is read from
    the shipped catalogs (catalog_files.py)."""
    config = settings_model(MixConfig, settings)
    read = read_catalog(inputs)
    catalog = read.catalog
    on_bad_row = config.on_bad_row or catalog.on_bad_row
    step = OutputStep("rufus-data mix", out if out is not None else default_out(read.name), overwrite=overwrite)
    opened, counter = open_sources(read)
    with step.folder() as tmp:
        parts_dir = tmp / "_parts"
        counted, selections = count_and_select(catalog, opened, counter, holdout=config.holdout, on_bad_row=on_bad_row,
                                               parts_dir=parts_dir, show_progress=show_progress)
        schema, clashing = unified_schema([part for c in counted for part in c.parts])
        rows_train = write_train([(c.parts, sel.picks) for c, sel in zip(counted, selections, strict=True)],
                                 tmp, catalog.seed, catalog.shard_rows, schema, clashing)
        held = read_picked_holdout([(c.parts, sel.holdout) for c, sel in zip(counted, selections, strict=True)], schema, clashing)
        rows_held = held.num_rows if held is not None else 0
        if rows_held:
            write_shards(held, tmp, catalog.shard_rows, split="holdout")
        shutil.rmtree(parts_dir)
        manifest = _manifest(step, read, counter, counted, selections, rows_train, rows_held,
                             {"holdout": config.holdout, "on_bad_row": on_bad_row})
        step.finish(tmp, manifest, _report(tmp, catalog, manifest))
    return StepResult(out=step.out, manifest=manifest, counts=manifest["counts"])


@dataclass
class MixedInput:
    """A command's input (rufus_data.sources.inputs) as a shard folder: the folder given, or the one its
    catalog was mixed into (`manifest`: that mix's manifest)."""

    input: DataInput
    folder: Path
    manifest: dict | None = None


def mix_inputs(items: Sequence[DataInput], folder_for: Callable[[DataInput], Path],
               show_progress: bool = False) -> list[MixedInput]:
    """Shard folders for the inputs of filter, pairs or a training stage: each catalog is mixed into
    `folder_for(input)` (replacing what is there: the same catalog gives the same shards), each
    folder is taken as it is."""
    found = []
    for item in items:
        if not item.catalog:
            found.append(MixedInput(item, item.path))
            continue
        result = mix(item.path, folder_for(item), overwrite=True, show_progress=show_progress)
        found.append(MixedInput(item, result.out, result.manifest))
    return found


# --- manifest, report, summary ------------------------------------------------------------


def _manifest(step: OutputStep, read: CatalogRead, counter, counted, selections, rows_train, rows_held,
              options: dict) -> dict:
    """The common core (config: the catalog's content and the command's options) and mix's own keys."""
    catalog = read.catalog
    sources = source_summaries(catalog, counted, selections)
    catalog_file = read.file_record()
    return step.manifest(
        config={"catalog": read.written, **options},
        inputs=[catalog_file, *({"source": c.spec.name, **c.fingerprint} for c in counted)],
        counts={"rows_in": sum(c.rows_in for c in counted), "rows_train": rows_train, "rows_holdout": rows_held,
                "rows_dropped": sum(len(c.bad_rows) + len(c.bad_lines) + c.too_long for c in counted)},
        versions=("transformers", "tokenizers", "pyarrow"),
        kind=catalog.kind,
        name=catalog.name,
        catalog=catalog_file,
        tokenizer=catalog.tokenizer,
        chat_template_sha256=_sha(counter.template),
        loss_mask=counter.loss.record() if counter.loss else None,
        seed=catalog.seed,
        basis=catalog.basis if catalog.kind == "sft" else "total",
        budget={"requested": catalog.budget, "used": round(sum(s.target_tokens for s in selections), 1)},
        rows={"train": rows_train, "holdout": rows_held},
        sources=sources,
        rewards=read.rewards,
        notes=share_notes(sources),
    )


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _report(folder: Path, catalog: MixtureCatalog, manifest: dict) -> str:
    """The text of report.md (and its figure, shares.png, written beside it)."""
    sources = manifest["sources"]
    names = [s["name"] for s in sources]
    bar_chart(
        folder / "shares.png",
        names,
        {"requested": [s["share_requested"] for s in sources], "realised": [s["share_realised"] for s in sources]},
        title=f"{catalog.name}: token share by source ({manifest['basis']} tokens)",
        ylabel="share of tokens",
    )
    rows = [
        (
            s["name"], s["label"], s["rows_in"], s["rows_out"], s["rows_holdout"],
            s["rows_dropped"]["bad_row"] + s["rows_dropped"]["too_long"], s["tokens"]["basis"],
            f"{s['share_requested']:.3f}", f"{s['share_realised']:.4f}", f"{s['repeat_factor']:.3f}",
        )
        for s in sources
    ]
    table = markdown_table(
        ["source", "label", "rows in", "rows out", "holdout", "dropped", tokens_column(manifest["basis"]), "share",
         "realised", "repeat"], rows
    )
    notes = "".join(f"- {n}\n" for n in manifest["notes"]) or "- every source is within 1 pp of its share\n"
    return (
        f"# Mixture `{catalog.name}` ({catalog.kind})\n\n"
        f"Tokenizer `{catalog.tokenizer}`, seed {catalog.seed}, basis `{manifest['basis']}`, "
        f"budget {manifest['budget']['used']:,.0f} tokens, {manifest['rows']['train']:,} rows "
        f"(+{manifest['rows']['holdout']:,} held out).\n\n{table}\n![token shares](shares.png)\n\n## Notes\n\n{notes}"
    )

