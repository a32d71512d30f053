"""Options as another tool spells them: what a `trl sft` or `lm_eval` user types, taken as the
Rufus option that means the same thing, with a one-line note, or refused with the line that says
where Rufus keeps that setting. A command lists its table with `borrowed_options(TABLE)`; the
command line is rewritten before typer parses it (cli_options._RufusCommand). docs/spellings.md
is the tables rendered by `spellings_markdown` (scripts/spellings_doc.py writes it)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Literal

from rufus_data.base.errors import RufusError

BORROWED_ATTRIBUTE = "rufus_borrowed"  # on a command's callback: {--name: Borrowed}
TRUE, FALSE = ("true", "yes", "1"), ("false", "no", "0")


@dataclass(frozen=True)
class Borrowed:
    """One option of another tool: `translate(value)` gives the Rufus arguments (a RufusError
    refuses it); `means` and `note` are the docs table's and the console note's words."""

    name: str  # --model_name_or_path
    tool: str  # TRL, lm-eval
    means: str  # what Rufus calls it, in words for the table
    translate: Callable[[str | None], list[str]]
    takes: Literal["value", "flag", "values"] = "value"  # a flag may be followed by true/false
    note: str = ""
    example: str | None = None  # a value the tests feed it
    shows: str = ""  # what the command then shows (the resolved value, or the refusal's words)


def borrowed_options(table: Iterable[Borrowed]):
    """Decorator: the command takes these options of another tool (translate_borrowed)."""
    def mark(command):
        setattr(command, BORROWED_ATTRIBUTE, {entry.name: entry for entry in table})
        return command
    return mark


def _value(args: list[str], i: int, takes: str) -> tuple[str | None, int]:
    """The value written after option i (None for a bare flag) and the index after it."""
    following = args[i + 1:]
    if takes == "values":
        values = []
        for arg in following:
            if arg.startswith("--"):
                break
            values.append(arg)
        return ",".join(values) or None, i + 1 + len(values)
    if following and not following[0].startswith("--") and (takes == "value" or following[0].lower() in TRUE + FALSE):
        return following[0], i + 2
    return None, i + 1


def translate_borrowed(args: list[str], table: dict[str, Borrowed], say: Callable[[str], None]) -> list[str]:
    """`args` with every option of `table` (either spelling) replaced by its Rufus arguments, each said."""
    out: list[str] = []
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--":
            return out + args[i:]
        name, eq, value = arg.partition("=")
        entry = table.get("--" + name[2:].replace("-", "_")) if name.startswith("--") else None
        if entry is None:
            out.append(arg)
            i += 1
            continue
        if eq:
            i += 1
        else:
            value, i = _value(args, i, entry.takes)
        rufus = entry.translate(value)
        say("note: " + taken_note(entry, f"{name} {value}" if value is not None else name, rufus))
        out += rufus
    return out


def taken_note(entry: Borrowed, written: str, rufus: list[str]) -> str:
    """What the console says of a borrowed option taken: `--lora_r 16 is TRL's spelling: taken as --lora.r 16`."""
    taken = f"taken as {' '.join(rufus)}" if rufus else "nothing to set"
    return f"{written} is {entry.tool}'s spelling: {taken}" + (f" ({entry.note})" if entry.note else "")


def is_true(name: str, value: str | None) -> bool:
    """A flag's value: bare or true/yes/1 is true, false/no/0 false, anything else refused."""
    if value is None or value.lower() in TRUE:
        return True
    if value.lower() in FALSE:
        return False
    raise RufusError(f"{name} {value}: a flag takes true or false (or nothing)")


def key_values(name: str, value: str | None) -> dict[str, str]:
    """lm-eval's `k=v,k=v` (--model_args, --gen_kwargs)."""
    pairs = [item for item in (value or "").split(",") if item.strip()]
    if not pairs or any("=" not in item for item in pairs):
        raise RufusError(f"{name} {value!r}: write KEY=VALUE pairs separated by commas (temperature=0.6,max_gen_toks=512)")
    return {k.strip(): v.strip() for k, v in (item.split("=", 1) for item in pairs)}


def refuse(line: str) -> Callable[[str | None], list[str]]:
    def refused(value: str | None) -> list[str]:
        raise RufusError(line)
    return refused


def spellings_markdown(tables: dict[str, Iterable[Borrowed]]) -> str:
    """The docs' table of every borrowed option: {command: table} -> markdown."""
    about = ("Generated from the code (scripts/spellings_doc.py): the options a `trl sft/dpo/grpo` or `lm_eval` user "
             "types, and what Rufus does with each. A mapped option prints a one-line note; a refused one says where "
             "Rufus keeps the setting.")
    lines = ["# Coming from TRL or lm-eval", "", about, ""]
    for command, table in tables.items():
        lines += [f"## `{command}`", "", "| you type | tool | Rufus | note |", "|---|---|---|---|"]
        lines += [f"| `{e.name}` | {e.tool} | {e.means} | {e.note} |" for e in table]
        lines.append("")
    return "\n".join(lines)
