"""`rufus-data inspect` and `rufus-data sql`: look at a shard folder with DuckDB.

`sql` prints its rows as a table, or as CSV or JSON for files and pipes (console.print_rows).

`inspect` prints rows and tokens per source and label (and how the trainable ones were found:
the manifest's loss-mask route), a token-length histogram, and the
sanity warnings for the data bugs that cost SmolLM3 days: rows of a source that declares a
system prompt but lack it, multi-turn rows whose reasoning-mode tag sits only in the first
turn, multi-turn /think rows with replies that do not reason (the mode on in some turns only), /no_think rows that reason, empty assistant turns, and exact duplicate rows. Its
reasoning-mode table counts the rows of each mode, the multi-turn ones, and those that reason
in every assistant turn (IFThink-style rows)."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

import duckdb

from rufus_data.base.errors import RufusError
from rufus_data.folders.shards import DATA_DIR, read_manifest, shard_row_counts, split_files
from rufus_data.sources.inputs import shard_folder

REASONING_TAGS = ("/think", "/no_think")
THINK_BLOCK = re.compile(r"<think>(.*?)</think>", re.DOTALL)
EXAMPLES = 3


@dataclass
class Inspection:
    per_source: list[dict]
    histogram: list[tuple[int, int, int]]  # (bin start, bin end, rows)
    warnings: list[str] = field(default_factory=list)
    # per reasoning mode (/think, /no_think, none: the tag of the system prompt): rows, multi_turn
    # (more than one assistant turn), reasoned_every_turn (a non-empty <think> block in each one)
    modes: list[dict] = field(default_factory=list)
    # how mix found the trainable tokens (rufus_data/models/loss_mask.py), from the manifest; None: not recorded
    loss_mask: dict | None = None


def connect(folder: str | Path, command: str = "rufus-data inspect") -> duckdb.DuckDBPyConnection:
    """A DuckDB connection with views `train` (alias `shards`) and, when present, `holdout`."""
    folder = shard_folder(folder, command)
    shard_row_counts([path for files in split_files(folder).values() for path in files])  # none, or a corrupt one
    con = duckdb.connect()
    for split in ("train", "holdout"):
        if list((folder / DATA_DIR).glob(f"{split}-*.parquet")):
            pattern = str(folder / DATA_DIR / f"{split}-*.parquet").replace("'", "''")
            con.execute(f"CREATE VIEW {split} AS SELECT * FROM read_parquet('{pattern}', union_by_name=true)")
    con.execute("CREATE VIEW shards AS SELECT * FROM train")
    return con


def run_sql(folder: str | Path, query: str) -> tuple[list[str], list[tuple]]:
    con = connect(folder, "rufus-data sql")
    try:
        result = con.execute(query)
    except duckdb.Error as err:
        raise RufusError(f"query failed: {err}. The views are `train` (alias `shards`) and `holdout`") from None
    columns = [d[0] for d in result.description or []]
    return columns, result.fetchall()


def inspect_shards(folder: str | Path, bins: int = 12) -> Inspection:
    con = connect(folder)
    columns = {row[0] for row in con.execute("DESCRIBE train").fetchall()}
    tokens = "sum(num_tokens)" if "num_tokens" in columns else "NULL"
    trainable = "sum(num_trainable_tokens)" if "num_trainable_tokens" in columns else "NULL"
    per_source = [
        {"source": s, "label": lab, "rows": n, "tokens": t, "trainable": tr}
        for s, lab, n, t, tr in con.execute(
            f"SELECT source, label, count(*), {tokens}, {trainable} FROM train GROUP BY ALL ORDER BY source, label"
        ).fetchall()
    ]
    histogram = _histogram(con, bins) if "num_tokens" in columns else []
    conversation = _conversation_column(columns)
    modes: dict[str, dict] = {}
    warnings = _row_warnings(con, Path(folder), conversation, columns, modes)
    warnings += _duplicate_warnings(con, conversation, columns)
    return Inspection(per_source, histogram, warnings, [{"mode": mode, **counts} for mode, counts in modes.items()],
                      read_manifest(folder).get("loss_mask"))


def _conversation_column(columns: set[str]) -> str:
    for name in ("messages", "prompt"):
        if name in columns:
            return name
    raise RufusError(f"shards have no `messages` or `prompt` column (columns: {sorted(columns)})")


def _histogram(con, bins: int) -> list[tuple[int, int, int]]:
    low, high = con.execute("SELECT min(num_tokens), max(num_tokens) FROM train").fetchone()
    if low is None:
        return []
    width = max(1, -(-(high - low + 1) // bins))
    rows = con.execute(
        f"SELECT (num_tokens - {low}) // {width} AS b, count(*) FROM train GROUP BY b ORDER BY b"
    ).fetchall()
    return [(low + b * width, low + (b + 1) * width - 1, n) for b, n in rows]


def _row_warnings(con, folder: Path, conversation: str, columns: set[str], modes: dict[str, dict]) -> list[str]:
    """What one pass over the rows finds: a source's system prompt missing, reasoning-mode tags and
    <think> blocks at odds with the mode, empty assistant turns; `modes` counts the rows by mode."""
    warnings = []
    manifest = read_manifest(folder)
    systems = {s["name"]: s.get("system") for s in manifest.get("sources", []) if s.get("system")}
    replies = [c for c in ("chosen", "rejected") if c in columns]  # preference rows: their replies too
    cursor = con.execute(f"SELECT id, source, {', '.join([conversation, *replies])} FROM train")
    missing_system: dict[str, list[str]] = {}
    tag_first_only, empty_assistant, think_uneven, no_think_reasons = [], [], [], []
    for row_id, source, turns, *reply_turns in _stream(cursor):
        turns = turns or []
        mode, replies = _mode(turns), [t for t in turns if t["role"] == "assistant"]
        reasoned = [_reasons(t["content"]) for t in replies]
        counts = modes.setdefault(mode, {"rows": 0, "multi_turn": 0, "reasoned_every_turn": 0})
        counts["rows"] += 1
        counts["multi_turn"] += len(replies) > 1
        counts["reasoned_every_turn"] += bool(reasoned) and all(reasoned)
        if mode == "/think" and len(replies) > 1 and any(reasoned) and not all(reasoned):
            think_uneven.append(row_id)
        if mode == "/no_think" and any(reasoned):
            no_think_reasons.append(row_id)
        wanted = systems.get(source)
        if wanted and not (turns and turns[0]["role"] == "system" and wanted in (turns[0]["content"] or "")):
            missing_system.setdefault(source, []).append(row_id)
        if _tag_only_in_first_turn(turns):
            tag_first_only.append(row_id)
        every_turn = [t for group in (turns, *reply_turns) for t in (group or [])]
        if any(t["role"] == "assistant" and not (t["content"] or "").strip() for t in every_turn):
            empty_assistant.append(row_id)
    for source, ids in missing_system.items():
        warnings.append(
            f"source '{source}' declares system prompt {systems[source]!r} but {len(ids)} rows lack it "
            f"(e.g. {', '.join(ids[:EXAMPLES])})"
        )
    if tag_first_only:
        warnings.append(
            f"{len(tag_first_only)} multi-turn rows carry a reasoning-mode tag ({'/'.join(REASONING_TAGS)}) only in "
            f"their first user turn, so later turns train without it (e.g. {', '.join(tag_first_only[:EXAMPLES])}); "
            "put the tag in the system prompt"
        )
    if think_uneven:
        warnings.append(
            f"{len(think_uneven)} multi-turn /think rows reason (<think>) in some replies but not in all, so those "
            f"turns train /think without reasoning (e.g. {', '.join(think_uneven[:EXAMPLES])}); keep every turn's "
            "reasoning (the source's `strip_past_reasoning: false`) or drop those rows"
        )
    if no_think_reasons:
        warnings.append(f"{len(no_think_reasons)} /no_think rows reason in a <think> block "
                        f"(e.g. {', '.join(no_think_reasons[:EXAMPLES])}): give them /think or strip the block")
    if empty_assistant:
        warnings.append(f"{len(empty_assistant)} rows have an empty assistant turn (e.g. {', '.join(empty_assistant[:EXAMPLES])})")
    return warnings


def _duplicate_warnings(con, conversation: str, columns: set[str]) -> list[str]:
    """Rows whose content (conversation, expected output, replies) is the same to the letter, the
    upsampled repeats mix writes on purpose (`#rep` ids) not counted."""
    content = [c for c in (conversation, "expected_output", "chosen", "rejected") if c in columns]
    key = " || '\x1f' || ".join(f"coalesce(to_json({c})::VARCHAR, '')" for c in content)
    dupes = con.execute(
        f"SELECT count(*) - count(DISTINCT {key}) FROM (SELECT * FROM train WHERE id NOT LIKE '%#rep%')"
    ).fetchone()[0]
    if not dupes:
        return []
    example = con.execute(
        f"SELECT list(id ORDER BY id)[1:{EXAMPLES}] FROM train WHERE id NOT LIKE '%#rep%' "
        f"GROUP BY {key} HAVING count(*) > 1 LIMIT 1"
    ).fetchone()[0]
    return [f"{dupes} exact duplicate rows (upsampled repeats not counted), e.g. {', '.join(example)}"]


def _stream(cursor, batch: int = 4096):
    """Rows of a DuckDB result in batches, so a large mix is never held in memory at once."""
    while rows := cursor.fetchmany(batch):
        yield from rows


def _tag_only_in_first_turn(turns: list[dict]) -> bool:
    users = [t["content"] or "" for t in turns if t["role"] == "user"]
    if len(users) < 2:
        return False
    system = turns[0]["content"] if turns and turns[0]["role"] == "system" else ""
    for tag in REASONING_TAGS:
        if _has_tag(users[0], tag) and not _has_tag(system or "", tag) and not any(_has_tag(u, tag) for u in users[1:]):
            return True
    return False


def _mode(turns: list[dict]) -> str:
    """The reasoning mode a row trains in: the tag of its system prompt ('none' without one)."""
    system = turns[0]["content"] or "" if turns and turns[0]["role"] == "system" else ""
    return next((tag for tag in REASONING_TAGS if _has_tag(system, tag)), "none")


def _reasons(content: str | None) -> bool:
    """A reply that opens with a non-empty <think> block."""
    match = THINK_BLOCK.match((content or "").lstrip())
    return bool(match and match.group(1).strip())


def _has_tag(text: str, tag: str) -> bool:
    return any(word == tag for word in text.split())


def to_json(inspection: Inspection) -> str:
    return json.dumps({"per_source": inspection.per_source, "histogram": inspection.histogram,
                       "modes": inspection.modes, "warnings": inspection.warnings,
                       "loss_mask": inspection.loss_mask}, indent=2)
