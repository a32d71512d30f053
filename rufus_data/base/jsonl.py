"""JSON Lines, read once: sources, benchmark files, eval tasks, the example shards and the BFCL wheel's data.

Each non-blank line must be UTF-8 text holding one JSON object. A line that is not is a RufusError
naming the file and the line and what to do, not a traceback from deep inside a command.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from pathlib import Path

from rufus_data.base.errors import RufusError


def parse_jsonl(lines: Iterable[bytes], where: str, what: str = "",
                bad_lines: list[tuple[int, str]] | None = None) -> Iterator[dict]:
    """The objects of JSONL `lines` (bytes, as a file opened "rb" yields them), in order; blank lines are
    skipped. `where` names the file in errors; `what`, when given, says whose file it is ("source 'gsm8k'").
    `bad_lines`, when given, collects (line number, problem) of each line that is no UTF-8 JSON
    object and the line is skipped (a step's `--on-bad-row skip` decides later); else it is an error."""
    prefix = f"{what}: " if what else ""
    for number, raw in enumerate(lines, start=1):
        record, problem = _line_object(raw, number)
        if problem is None:
            if record is not None:
                yield record
        elif bad_lines is None:
            raise RufusError(f"{prefix}{where} line {number} {problem}")
        else:
            bad_lines.append((number, problem.partition(";")[0]))


def _line_object(raw: bytes, number: int) -> tuple[dict | None, str | None]:
    """(the line's object, None), (None, None) for a blank line, or (None, what is wrong with it)."""
    try:
        line = raw.decode("utf-8-sig" if number == 1 else "utf-8")  # a byte-order mark is no error
    except UnicodeDecodeError as err:
        return None, f"is not valid UTF-8 ({err.reason} at byte {err.start}); re-encode the file as UTF-8 or drop that line"
    if not line.strip():
        return None, None
    try:
        record = json.loads(line)
    except json.JSONDecodeError as err:
        return None, f"is not valid JSON ({err.msg}); fix or remove it"
    except RecursionError:
        return None, "nests its JSON deeper than a reader can follow; flatten or remove it"
    if not isinstance(record, dict):
        return None, f"is a JSON {type(record).__name__}, not an object; each line must hold one object"
    return record, None


def read_jsonl(path: str | Path, what: str = "", bad_lines: list[tuple[int, str]] | None = None) -> Iterator[dict]:
    """The objects of the JSONL file at `path`, streamed in file order (see `parse_jsonl`)."""
    path = Path(path)
    if not path.is_file():
        raise RufusError(f"{what + ': ' if what else ''}{path} does not exist (or is no file): check the path")
    with open(path, "rb") as fh:
        yield from parse_jsonl(fh, str(path), what, bad_lines)
