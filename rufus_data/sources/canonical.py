"""Sources: open a catalog source (rufus_data.sources.dataset_source finds where its rows are; a
fallback and a builder step may stand in) and turn its rows into canonical rows: each row is
read by its format (rufus_data/sources/source_formats.py) and shaped into the catalog's kind here.

Canonical rows carry `id` (source name + row number: stable across runs), `source`, `label`,
then the columns of the catalog's kind (`rufus_data.folders.shards.KIND_COLUMNS`). Every column the
format does not consume passes through untouched (a column that would clash with a canonical
name is kept as `orig_<name>`)."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field

from rufus_data.base.console import console
from rufus_data.folders.shards import CANONICAL_COLUMNS, Kind
from rufus_data.sources.builders import BUILDERS, build_rows
from rufus_data.sources.catalog import SourceRows, SourceSpec
from rufus_data.sources.dataset_source import DatasetUnavailable, load_rows
from rufus_data.sources.source_formats import FORMATS, BadRow, split_last_assistant

THINK_BLOCK = re.compile(r"<think>.*?</think>\s*", re.DOTALL)


@dataclass
class OpenedSource:
    """A source ready to read: the spec it loads as (its fallback's places, build, format and
    fields when the fallback stood in), its raw rows, and where they came from."""

    spec: SourceSpec
    rows: Iterator[dict]
    provenance: dict  # rufus_data.sources.dataset_source provenance, plus `fallback` and `build` when used
    count: int | None = None  # raw rows to expect (None: unknown until read)
    # (line, problem) of the file's lines that hold no JSON object, skipped while the rows are read:
    # the caller reports them (mix, by --on-bad-row)
    bad_lines: list[tuple[int, str]] = field(default_factory=list)


def open_source(spec: SourceSpec) -> OpenedSource:
    """Find the first place of the source that loads; if none does and the source has a
    `fallback:`, the fallback's. Says so on the console and in the provenance. A builder step
    (`build:`) then makes the source's rows from what loaded. Lines of a JSONL file that hold no
    JSON object are skipped into `bad_lines`, for the caller to report."""
    what = f"source '{spec.name}'"
    bad_lines: list[tuple[int, str]] = []
    try:
        loaded = load_rows(spec, what, bad_lines=bad_lines)
    except DatasetUnavailable as err:
        if spec.fallback is None:
            raise
        fallback = spec.fallback
        try:
            loaded = load_rows(fallback, f"{what} (fallback)", bad_lines=bad_lines)
        except DatasetUnavailable as fallback_err:  # name the source's own place too, not only its stand-in
            raise DatasetUnavailable(f"{what}: {_describe(spec)} is not available here, and {fallback_err}") from None
        loaded.provenance["fallback"] = {"used": True, "instead_of": _describe(spec), "why": str(err)}
        console.print(f"[yellow]note:[/] {what}: {_describe(spec)} is not available here; using its fallback "
                      f"{_describe(fallback)} (from {loaded.provenance['from']})", highlight=False)
        spec = spec.model_copy(update={
            "path": fallback.path, "local": fallback.local, "hub": fallback.hub, "ids": fallback.ids,
            "build": fallback.build, "format": fallback.format, "fields": fallback.fields, "label": fallback.label,
        })
    rows, count = loaded.rows, loaded.count
    if spec.build is not None:
        built = Counter()
        loaded.provenance["build"] = {"step": spec.build, "summary": BUILDERS[spec.build].summary, "counts": built}
        rows, count = build_rows(spec.build, rows, what, built), None
    return OpenedSource(spec, rows, loaded.provenance, count, bad_lines)


def _describe(rows: SourceRows) -> str:
    """`build(origin)` or the origin, as the catalog writes them."""
    origin = rows.path or (f"$RUFUS_DATA_ROOT/{rows.local}" if rows.local else None) or (
        f"hub {rows.hub.describe()}" if rows.hub else "?")
    return f"{rows.build} built from {origin}" if rows.build else origin


class Canonicaliser:
    """Turns raw records of one source into canonical rows of the catalog's kind."""

    def __init__(self, spec: SourceSpec, kind: Kind, fmt: str, columns: dict[str, str | None]):
        self.spec, self.kind, self.fmt, self.columns = spec, kind, fmt, columns
        self.consumed = {c for c in columns.values() if c}
        if kind == "rl" and fmt == "question_answer":
            # rewards read the gold from `solution` (or whichever column held the answer): it stays
            self.consumed.discard(columns.get("answer"))
        self.label = spec.default_label

    def __call__(self, record: dict, index: int) -> dict:
        row = {"id": f"{self.spec.name}-{index}", "source": self.spec.name, "label": self.label}
        row.update(self._shape(record))
        for key, value in record.items():
            if key in self.consumed:
                continue
            row[f"orig_{key}" if key in CANONICAL_COLUMNS else key] = value
        return row

    # --- shapes -------------------------------------------------------------------------
    def _shape(self, record: dict) -> dict:
        conversation, expected, pair = FORMATS[self.fmt].read(record, self.columns)
        system = self.spec.system
        strip = self.spec.strip_past_reasoning
        if self.kind == "sft":
            if conversation is None or not any(m["role"] == "assistant" for m in conversation):
                raise BadRow("no assistant turn to train on")
            messages = _with_system(conversation, system)
            return {"messages": _strip_reasoning(messages, keep_last=True) if strip else messages}
        if self.kind == "rl":
            if pair is not None:
                raise BadRow("preference rows cannot feed an rl catalog")
            ends_with_user = bool(conversation) and conversation[-1]["role"] == "user"  # already a prompt
            prompt, last = (conversation, None) if ends_with_user else split_last_assistant(conversation)
            if self.fmt == "prompt_only":
                expected = None
            elif expected is None:
                expected = last
            prompt = _with_system(prompt, system)
            if not any(m["role"] == "user" for m in prompt):
                raise BadRow("no user turn in the prompt")
            return {"prompt": _strip_reasoning(prompt, keep_last=False) if strip else prompt, "expected_output": expected}
        # preference
        if pair is None:
            raise BadRow("no chosen/rejected pair")
        prompt, chosen, rejected = pair
        prompt = _with_system(prompt, system)
        if strip:
            prompt = _strip_reasoning(prompt, keep_last=False)
        return {"prompt": prompt, "chosen": chosen, "rejected": rejected}


def _with_system(messages: list[dict], system: str | None) -> list[dict]:
    """Add the source's system prompt (e.g. /think) unless the row already carries it."""
    if not system:
        return messages
    if messages and messages[0]["role"] == "system":
        if system in messages[0]["content"]:
            return messages
        return [{"role": "system", "content": f"{messages[0]['content']}\n{system}".strip()}] + messages[1:]
    return [{"role": "system", "content": system}] + messages


def _strip_reasoning(messages: list[dict], keep_last: bool) -> list[dict]:
    """Remove <think> blocks from earlier assistant turns, as hybrid-reasoning templates do."""
    last = max((i for i, m in enumerate(messages) if m["role"] == "assistant"), default=-1) if keep_last else -1
    out = []
    for i, m in enumerate(messages):
        if m["role"] == "assistant" and i != last and "<think>" in m["content"]:
            m = {"role": "assistant", "content": THINK_BLOCK.sub("", m["content"]).lstrip()}
        out.append(m)
    return out
