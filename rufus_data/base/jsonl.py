"""JSON Lines, read once: sources, benchmark files, eval tasks, the example shards and the BFCL wheel's data.

Each non-blank line must be UTF-8 text holding one JSON object. A line that is not is a RufusError
naming the file and the line and what to do, not a traceback from deep inside a command.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from pathlib import Path

from rufus_data.base.errors import RufusError


def parse_jsonl(lines: Iterable[bytes], where: str, what: str = "") -> Iterator[dict]:
    """The objects of JSONL `lines` (bytes, as a file opened "rb" yields them), in order; blank lines are
    skipped. `where` names the file in errors; `what`, when given, says whose file it is ("source 'gsm8k'")."""
    prefix = f"{what}: " if what else ""
    for number, raw in enumerate(lines, start=1):
        try:
            line = raw.decode("utf-8-sig" if number == 1 else "utf-8")  # a byte-order mark is no error
        except UnicodeDecodeError as err:
            raise RufusError(
                f"{prefix}{where} line {number} is not valid UTF-8 ({err.reason} at byte {err.start}); "
                "re-encode the file as UTF-8 or drop that line"
            ) from None
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            raise RufusError(f"{prefix}{where} line {number} is not valid JSON ({err.msg}); fix or remove it") from None
        except RecursionError:
            raise RufusError(f"{prefix}{where} line {number} nests its JSON deeper than a reader can follow; "
                             "flatten or remove it") from None
        if not isinstance(record, dict):
            raise RufusError(f"{prefix}{where} line {number} is a JSON {type(record).__name__}, not an object; "
                             "each line must hold one object")
        yield record


def read_jsonl(path: str | Path, what: str = "") -> Iterator[dict]:
    """The objects of the JSONL file at `path`, streamed in file order (see `parse_jsonl`)."""
    path = Path(path)
    if not path.is_file():
        raise RufusError(f"{what + ': ' if what else ''}{path} does not exist (or is no file): check the path")
    with open(path, "rb") as fh:
        yield from parse_jsonl(fh, str(path), what)
