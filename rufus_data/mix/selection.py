"""Passes 1 and 2 of `mix`, which the run and its --dry-run plan share: read the catalog, open its
sources and load the tokenizer; canonicalise and count every row (the run also keeps the canonical
rows as parquet parts for pass 3; the plan keeps only the counts); choose each source's rows by
token share; and the per-source figures (rows, tokens, shares, repeats) that the manifest, the
report, the run's summary and the plan all show. One arithmetic, so a plan says what a run writes."""

from __future__ import annotations

import hashlib
import random
import time
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import yaml

from rufus_data.base.catalog_files import resolve_entry
from rufus_data.base.console import RateColumn, console, print_rows, progress
from rufus_data.base.errors import RufusError
from rufus_data.base.yaml_config import load_yaml_text
from rufus_data.folders.dataset_card import tokens_column
from rufus_data.mix.config import OnBadRow
from rufus_data.models.chat_template import read_chat_template
from rufus_data.rewards.data_rewards import REWARD_COLUMN, encode_specs, normalise_specs
from rufus_data.sources.canonical import Canonicaliser, OpenedSource, open_source
from rufus_data.sources.catalog import (
    MixtureCatalog,
    SourceSpec,
    catalog_from_data,
    catalog_hash,
    load_catalog,
)
from rufus_data.sources.source_formats import BadRow, detect_format, resolve_columns
from rufus_data.sources.tokens import TokenCounter

BATCH_ROWS = 1024
SHARE_TOLERANCE_PP = 1.0
BAD_ROW_EXAMPLES = 5


@dataclass
class SourceCounts:
    """One source after the counting pass: per-row token counts and what was set aside."""

    spec: SourceSpec
    format: str = ""
    fingerprint: dict = field(default_factory=dict)
    rows_in: int = 0
    total: list[int] = field(default_factory=list)  # per canonical row (parts order)
    trainable: list[int] = field(default_factory=list)
    bad_rows: list[tuple[int, str]] = field(default_factory=list)
    bad_lines: list[tuple[int, str]] = field(default_factory=list)  # of the file: no JSON object on them
    too_long: int = 0
    parts: list[Path] = field(default_factory=list)

    def basis(self, catalog: MixtureCatalog) -> list[int]:
        return self.trainable if catalog.kind == "sft" and catalog.basis == "trainable" else self.total


@dataclass
class Selection:
    """Rows chosen for one source: (row index, repeat number) pairs, plus the held-out rows."""

    picks: list[tuple[int, int]]
    holdout: list[int]
    target_tokens: float
    tokens: int
    repeat_factor: float


@dataclass
class CatalogRead:
    """A mix's catalog as read: from a file (`path`) or given from Python (`path` None), as written
    (`written`: the manifest's config.catalog) and validated, with its rewards by label."""

    path: Path | None
    catalog: MixtureCatalog
    written: dict
    rewards: dict[str, list]

    @property
    def folder(self) -> Path:
        """Where its relative paths (a chat template file) are read from: its file's folder, else here."""
        return self.path.parent if self.path else Path.cwd()

    @property
    def name(self) -> str:
        """The default output folder's name: the file's stem, else the catalog's `name`."""
        return self.path.stem if self.path else self.catalog.name

    def file_record(self) -> dict:
        """Path (None: given from Python) and sha256 of the catalog, as manifests record it."""
        if self.path is not None:
            return {"path": str(self.path), "sha256": catalog_hash(self.path)}
        text = yaml.safe_dump(self.written, sort_keys=True).encode()
        return {"path": None, "sha256": hashlib.sha256(text).hexdigest()}


def read_catalog(given: str | Path | dict | MixtureCatalog) -> CatalogRead:
    """A catalog file, or one given as a dict or a MixtureCatalog (its relative source paths read
    from the working folder); a relative `catalogs/...` path the working folder lacks is read from
    the shipped catalogs (catalog_files.py)."""
    if isinstance(given, (str, Path)):
        path = resolve_entry(given)
        catalog = load_catalog(path)
        written = load_yaml_text(path.read_text(encoding="utf-8"), str(path))
    else:
        written = given.model_dump(mode="json", exclude_unset=True) if isinstance(given, MixtureCatalog) else given
        path, catalog = None, catalog_from_data(written, Path.cwd())
    return CatalogRead(path, catalog, written, _rewards_by_label(catalog))


def open_sources(read: CatalogRead) -> tuple[list[OpenedSource], TokenCounter]:
    """Every source's rows found (before the tokenizer loads: a missing source is said first), then
    the tokenizer with the catalog's chat template."""
    catalog = read.catalog
    opened = [open_source(spec) for spec in catalog.sources]
    template = read_chat_template(catalog.chat_template, read.folder, str(read.path or catalog.name)) \
        if catalog.chat_template else None
    masks = "none" if catalog.kind == "rl" else "required" if catalog.kind == "sft" and catalog.basis == "trainable" else "if_any"
    counter = TokenCounter(catalog.tokenizer, template, masks=masks)
    _say_loss_mask(catalog, counter)
    return opened, counter


def count_and_select(catalog: MixtureCatalog, opened: list[OpenedSource], counter: TokenCounter, *,
                     holdout: int | None, on_bad_row: OnBadRow, parts_dir: Path | None,
                     show_progress: bool = False) -> tuple[list[SourceCounts], list[Selection]]:
    """Passes 1 and 2: each source counted (its canonical rows written under `parts_dir`, or kept
    nowhere when it is None: a plan), then its rows chosen by token share."""
    counted = [_count_source(source, catalog, counter, parts_dir, on_bad_row, show_progress) for source in opened]
    return counted, select_rows(catalog, counted, holdout)


def _rewards_by_label(catalog: MixtureCatalog) -> dict[str, list]:
    """{label: reward specs} of the sources that declare `reward:`; sources sharing a label must share it."""
    found: dict[str, tuple[str, list]] = {}
    for source in catalog.sources:
        if source.reward is None:
            continue
        specs = normalise_specs(source.reward)
        label = source.default_label
        first = found.setdefault(label, (source.name, specs))
        if first[1] != specs:
            raise RufusError(f"sources '{first[0]}' and '{source.name}' share the label {label!r} but declare different "
                             "rewards: a row's reward is looked up by its label, so give one of them its own `label:`")
    return {label: specs for label, (_, specs) in sorted(found.items())}


def _say_loss_mask(catalog: MixtureCatalog, counter: TokenCounter) -> None:
    """Which tokens count as trainable, said once (rl prompts have none); a template no route serves
    counts total tokens only, which `basis: trainable` refuses (TokenCounter) and `basis: total` warns."""
    if catalog.kind == "rl":
        return
    if counter.loss is not None:
        console.print(counter.loss.describe(), highlight=False)
        return
    console.print(f"[yellow]warning:[/] num_trainable_tokens will be 0 (shares count total tokens, so the mix is "
                  f"right): {counter.no_mask_reason}", highlight=False)


# --- pass 1: canonicalise and count ------------------------------------------------------


def _count_source(
    source: OpenedSource,
    catalog: MixtureCatalog,
    counter: TokenCounter,
    parts_dir: Path | None,
    on_bad_row: OnBadRow,
    show_progress: bool,
) -> SourceCounts:
    spec = source.spec
    counts = SourceCounts(spec=spec, fingerprint=source.provenance)
    folder = None if parts_dir is None else parts_dir / spec.name
    if folder is not None:
        folder.mkdir(parents=True)
    records = source.rows
    first = next(records, None)
    if first is None and source.bad_lines:  # no line of the file holds a row
        counts.bad_lines = source.bad_lines
        _report_bad_rows(spec, counts, "error", source.provenance["from"])
    if first is None:
        raise RufusError(f"source '{spec.name}' ({source.provenance['from']}) is empty: it has no rows")
    counts.format = detect_format(spec, first, catalog.kind)
    columns = resolve_columns(spec, counts.format, first)
    canonicalise = Canonicaliser(spec, catalog.kind, counts.format, columns)
    tokens_column = TokensColumn()
    index = 0

    def batches():
        nonlocal index
        batch: list[dict] = []
        for index, record in enumerate(_chain(first, records), start=1):
            try:
                batch.append(canonicalise(record, index - 1))
            except BadRow as err:
                counts.bad_rows.append((index, str(err)))
            if len(batch) >= BATCH_ROWS:
                yield batch
                batch = []
        if batch:
            yield batch

    with progress("rows", tokens_column) as bar:
        task = bar.add_task(f"{spec.name}", total=source.count, visible=show_progress)
        for batch, measured in counter.count_batches(batches(), catalog.kind):
            _flush(batch, measured, counts, folder, tokens_column)
            bar.update(task, completed=index)
        bar.update(task, completed=index, total=index)
    counts.rows_in = index
    counts.bad_lines = source.bad_lines
    if counts.bad_rows or counts.bad_lines:
        _report_bad_rows(spec, counts, on_bad_row, source.provenance["from"])
    if not counts.total:
        raise RufusError(f"source '{spec.name}': none of its {index} rows is usable (see the reasons above)")
    return counts


class TokensColumn(RateColumn):
    """tokens/s beside rows/s in the progress bar."""

    def __init__(self):
        super().__init__("tok")
        self.tokens = 0
        self.started = time.time()

    def render(self, task):
        from rich.text import Text

        elapsed = max(1e-6, time.time() - self.started)
        return Text(f"{self.tokens / elapsed:,.0f} tok/s", style="magenta")


def _chain(first, rest):
    yield first
    yield from rest


def _flush(batch, measured, counts: SourceCounts, folder: Path | None, tokens_column) -> None:
    limit = counts.spec.max_tokens_per_example
    reward = None if counts.spec.reward is None else encode_specs(normalise_specs(counts.spec.reward))
    kept = []
    for row, total, trainable in zip(batch, measured.total, measured.trainable, strict=True):
        if limit is not None and total > limit:
            counts.too_long += 1
            continue
        row["num_tokens"] = total
        row["num_trainable_tokens"] = trainable
        if reward is not None:  # the source's reward travels with each row (rewards/data_rewards.py)
            row[REWARD_COLUMN] = reward
        counts.total.append(total)
        counts.trainable.append(trainable)
        kept.append(row)
    tokens_column.tokens += sum(measured.total)
    if kept and folder is not None:  # a plan keeps the counts only
        path = folder / f"part-{len(counts.parts):05d}.parquet"
        pq.write_table(pa.Table.from_pylist(kept), path)
        counts.parts.append(path)


def _report_bad_rows(spec: SourceSpec, counts: SourceCounts, on_bad_row: OnBadRow, origin: str) -> None:
    """Stop (--on-bad-row error), or warn and go on (skip), naming how many lines and rows were bad and the first few."""
    parts = []
    if counts.bad_lines:
        first = "; ".join(f"line {n} {why}" for n, why in counts.bad_lines[:BAD_ROW_EXAMPLES])
        parts.append(f"{len(counts.bad_lines)} lines of the file hold no JSON object (first: {first})")
    if counts.bad_rows:
        first = ", ".join(f"row {n} ({why})" for n, why in counts.bad_rows[:BAD_ROW_EXAMPLES])
        parts.append(f"{len(counts.bad_rows)} of {counts.rows_in} rows lack what the {counts.format} format needs; "
                     f"first: {first}")
    message = f"source '{spec.name}' ({origin}): " + "; and ".join(parts)
    if on_bad_row == "error":
        raise RufusError(message + ". Fix the rows, map the columns with `fields:`, or pass --on-bad-row skip")
    console.print(f"[yellow]warning:[/] {message}; skipped (--on-bad-row skip)", highlight=False, soft_wrap=True)


# --- pass 2: choose rows by token share ---------------------------------------------------


def select_rows(catalog: MixtureCatalog, counted: list[SourceCounts], holdout_override: int | None) -> list[Selection]:
    """Hold out rows, fix the budget, then pick each source's rows to reach its token target."""
    rngs = {c.spec.name: random.Random(f"{catalog.seed}:{c.spec.name}") for c in counted}
    pools: list[list[int]] = []
    held: list[list[int]] = []
    for c in counted:
        n_holdout = c.spec.holdout  # a source's own setting is the most specific one
        if n_holdout is None:
            n_holdout = holdout_override if holdout_override is not None else catalog.holdout
        order = list(range(len(c.total)))
        rngs[c.spec.name].shuffle(order)
        if n_holdout >= len(order):
            raise RufusError(
                f"source '{c.spec.name}': holdout of {n_holdout} rows leaves none to mix (it has {len(order)} usable rows)"
            )
        held.append(sorted(order[:n_holdout]))
        pools.append(order[n_holdout:])
    available = [sum(c.basis(catalog)[i] for i in pool) for c, pool in zip(counted, pools, strict=True)]
    budget = _budget(catalog, counted, available)
    selections = []
    for c, pool, hold, have in zip(counted, pools, held, available, strict=True):
        target = c.spec.share * budget
        basis = c.basis(catalog)
        if have <= 0:
            raise RufusError(f"source '{c.spec.name}' has no {catalog.basis} tokens to contribute")
        repeats = 0
        if have < target * (1 - 1e-9):  # a derived budget makes target == have up to rounding
            if not c.spec.upsample:
                short = target - have
                raise RufusError(
                    f"source '{c.spec.name}' has {have:,} tokens but its share {c.spec.share} of the {budget:,.0f}-token "
                    f"budget needs {target:,.0f}: short by {short:,.0f} tokens ({short / target:.1%}). Set `upsample: true` "
                    "on the source, lower its share, or lower `budget`"
                )
            repeats = int(target // have)
        picks = [(i, r) for r in range(repeats) for i in pool]
        remainder = target - repeats * have
        taken = 0
        for i in pool:  # the pool is already in seeded order
            if taken >= remainder:
                break
            if abs(taken + basis[i] - remainder) > abs(taken - remainder) and taken > 0:
                break
            picks.append((i, repeats))
            taken += basis[i]
        tokens = repeats * have + taken
        selections.append(Selection(picks, hold, target, tokens, tokens / have))
    return selections


def _budget(catalog: MixtureCatalog, counted: list[SourceCounts], available: list[int]) -> float:
    """The catalog's budget, or the largest one the sources allow without upsampling."""
    if catalog.budget is not None:
        return float(catalog.budget)
    limits = [have / c.spec.share for c, have in zip(counted, available, strict=True) if not c.spec.upsample]
    if not limits:
        limits = [have / c.spec.share for c, have in zip(counted, available, strict=True)]
    return float(min(limits))




# --- what a run and its plan show -----------------------------------------------------------


def source_summaries(catalog: MixtureCatalog, counted: list[SourceCounts], selections: list[Selection]) -> list[dict]:
    """Each source's figures after selection: the manifest's `sources`, the report's table, the
    run's summary and the --dry-run plan."""
    total_basis = sum(s.tokens for s in selections) or 1
    sources = []
    for c, sel in zip(counted, selections, strict=True):
        realised = sel.tokens / total_basis
        sources.append(
            {
                "name": c.spec.name,
                "label": c.spec.default_label,
                "format": c.format,
                "fingerprint": c.fingerprint,
                "rows_in": c.rows_in,
                "rows_out": len(sel.picks),
                "rows_holdout": len(sel.holdout),
                "rows_dropped": {"bad_row": len(c.bad_rows), "bad_line": len(c.bad_lines), "too_long": c.too_long},
                "bad_line_examples": [{"line": n, "why": why} for n, why in c.bad_lines[:BAD_ROW_EXAMPLES]],
                "bad_row_examples": [{"row": n, "why": why} for n, why in c.bad_rows[:BAD_ROW_EXAMPLES]],
                "tokens": {"total": sum(c.total[i] for i, _ in sel.picks),
                           "trainable": sum(c.trainable[i] for i, _ in sel.picks), "basis": sel.tokens},
                "share_requested": c.spec.share,
                "share_realised": round(realised, 6),
                "share_error_pp": round(100 * (realised - c.spec.share), 4),
                "target_tokens": round(sel.target_tokens, 1),
                "repeat_factor": round(sel.repeat_factor, 6),
                "system": c.spec.system,
                "reward": normalise_specs(c.spec.reward) or None,
            }
        )
    return sources


def share_notes(sources: list[dict]) -> list[str]:
    """A note for each source further than SHARE_TOLERANCE_PP from its share."""
    return [
        f"source '{s['name']}' is {s['share_error_pp']:+.2f} pp from its share: its rows are large against its "
        f"{s['target_tokens']:,.0f}-token target (a tiny catalog); raise `budget` or add rows"
        for s in sources
        if abs(s["share_error_pp"]) > SHARE_TOLERANCE_PP
    ]


SOURCE_COLUMNS = ["source", "rows in", "holdout", "rows out", "{basis} tokens", "target share", "realised share", "repeats",
                  "dropped"]


def print_sources(title: str | None, sources: list[dict], notes: list[str], basis: str) -> None:
    """The per-source table on stdout (what the run wrote, or what the plan would), with a total;
    its token column counts the `basis` tokens and says so."""
    rows = [(s["name"], f"{s['rows_in']:,}", f"{s['rows_holdout']:,}", f"{s['rows_out']:,}", f"{s['tokens']['basis']:,}",
             f"{s['share_requested']:.3f}", f"{s['share_realised']:.4f}", f"{s['repeat_factor']:.2f}",
             f"{s['rows_dropped']['bad_row'] + s['rows_dropped']['too_long']:,}") for s in sources]
    rows.append(("total", *(f"{sum(f(s) for s in sources):,}" for f in (
        lambda s: s["rows_in"], lambda s: s["rows_holdout"], lambda s: s["rows_out"], lambda s: s["tokens"]["basis"])),
        f"{sum(s['share_requested'] for s in sources):.3f}", f"{sum(s['share_realised'] for s in sources):.4f}", "",
        f"{sum(s['rows_dropped']['bad_row'] + s['rows_dropped']['too_long'] for s in sources):,}"))
    print_rows([tokens_column(basis) if c == "{basis} tokens" else c for c in SOURCE_COLUMNS], rows, title=title)
    for note in notes:
        console.print(f"[yellow]note:[/] {note}")
