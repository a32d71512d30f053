"""Source formats: how a raw row of each format reads, as a conversation, an answer or a
preference pair, in one table (`FORMATS`), as rufus_data/sources/builders.py is for builder steps. A new
format is one entry: its columns, how a first row is recognised as it, and how a row reads.

`detect_format` tries the entries in table order on a source's first row (so the more specific
ones come first: ShareGPT before any conversation, a preference pair before a prompt);
`resolve_columns` finds each field's column; rufus_data/sources/canonical.py shapes what a row read into
the catalog's kind."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from rufus_data.base.errors import RufusError
from rufus_data.folders.shards import Kind, as_messages, content_text

HH_TURN = re.compile(r"\n\n(Human|Assistant): ")
CONVERSATION_COLUMNS = ("messages", "conversations", "conversation")
SHAREGPT_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant",
                  "system": "system", "tool": "tool", "function_response": "tool", "observation": "tool"}
ROLES = ("system", "user", "assistant", "tool")

Messages = list[dict]
# what a row reads as: (conversation, expected answer, (prompt, chosen, rejected)), each or None
Read = tuple[Messages | None, str | None, tuple[Messages, Messages, Messages] | None]


class DeclaredSource(Protocol):
    """What a catalog source declares about its rows (rufus_data.sources.catalog.SourceSpec is one); a
    protocol, because catalog.py builds on this module (DECLARED_FORMATS), never the reverse."""

    name: str
    format: str
    fields: dict[str, str]


class BadRow(ValueError):
    """A row that lacks what its format needs; collected and reported by row number."""


@dataclass(frozen=True)
class FirstRow:
    """What detection sees of a source: its first row, its `fields:` map and the catalog's kind."""

    row: dict
    fields: dict[str, str]
    kind: Kind

    @property
    def columns(self) -> set[str]:
        """The row's columns and the columns `fields:` names."""
        return set(self.row) | set(self.fields.values())

    @property
    def names(self) -> set[str]:
        """The columns, plus the canonical fields `fields:` maps (a mapped field counts as present)."""
        return self.columns | set(self.fields)

    @property
    def conversation(self) -> str | None:
        """The column holding a conversation, if any."""
        return next((c for c in CONVERSATION_COLUMNS if c in self.columns), None)


@dataclass(frozen=True)
class SourceFormat:
    fields: dict[str, tuple[str, ...]]  # canonical field -> columns tried in order without a `fields:` map
    detect: Callable[[FirstRow], bool]  # is a source whose first row looks like this of this format
    read: Callable[[dict, dict[str, str | None]], Read]  # (row, field -> column) -> what it reads as
    optional: frozenset[str] = frozenset()  # fields a row may lack
    declared: bool = True  # a catalog may name it in `format:` (else it is only detected)


# --- reading cells ------------------------------------------------------------------------


def _field(record: dict, column: str | None):
    if column is None or record.get(column) is None:
        raise BadRow(f"missing field '{column}'")
    return record[column]


def _text(value, name: str) -> str:
    if not isinstance(value, str):
        raise BadRow(f"field '{name}' is {type(value).__name__}, not text")
    if not value.strip():
        raise BadRow(f"field '{name}' is empty")
    return value


def _content(value, role: str, turn: int) -> str:
    """Message content as text (shards.content_text); an assistant turn without text would train
    on an empty reply: a bad row (refused, or skipped and counted with --on-bad-row skip)."""
    text = content_text(value)
    if role == "assistant" and not (text or "").strip():
        raise BadRow(f"assistant turn {turn} has no text (content {'null' if value is None else repr(value)[:40]}): "
                     "it would train on an empty reply")
    return text or ""


def read_turns(turns, sharegpt: bool = False) -> Messages:
    """A list of turns ({role, content}, or ShareGPT's {from, value}) as checked messages."""
    if not isinstance(turns, list) or not turns:
        raise BadRow("conversation is empty or not a list")
    out = []
    for number, turn in enumerate(turns, 1):
        if not isinstance(turn, dict):
            raise BadRow("a turn is not an object")
        if sharegpt:
            role = SHAREGPT_ROLES.get(str(turn.get("from", "")).lower())
            content = turn.get("value")
        else:
            role, content = turn.get("role"), turn.get("content")
        if role not in ROLES:
            raise BadRow(f"unknown role {role!r}")
        out.append({"role": role, "content": _content(content, role, number)})
    return out


def _turns_of(value, role: str) -> Messages:
    """A cell as messages by the one rule (shards.as_messages); a string must hold text."""
    if isinstance(value, str):
        _text(value, role)
    return read_turns(as_messages(value, role))


def _optional_text(value) -> str | None:
    """An answer cell as text: numbers (GSM8K-style int answers) become strings, null stays null."""
    return value if value is None or isinstance(value, str) else str(value)


def split_last_assistant(conversation: Messages) -> tuple[Messages, str | None]:
    """prompt = the turns before the last assistant turn; expected = that turn's content (or None)."""
    for i in range(len(conversation) - 1, -1, -1):
        if conversation[i]["role"] == "assistant":
            return conversation[:i], conversation[i]["content"]
    return conversation, None


def parse_hh_transcript(text: str) -> Messages:
    """'\\n\\nHuman: ...\\n\\nAssistant: ...' transcripts (HH-RLHF) as messages."""
    parts = HH_TURN.split(text)
    messages = []
    for speaker, content in zip(parts[1::2], parts[2::2], strict=False):
        messages.append({"role": "user" if speaker == "Human" else "assistant", "content": content.strip()})
    if not messages:
        raise BadRow("transcript has no Human:/Assistant: turns")
    return messages


# --- one reader per format ----------------------------------------------------------------


def _read_messages(record: dict, col: dict) -> Read:
    return read_turns(_field(record, col["messages"])), None, None


def _read_sharegpt(record: dict, col: dict) -> Read:
    return read_turns(_field(record, col["conversations"]), sharegpt=True), None, None


def _read_alpaca(record: dict, col: dict) -> Read:
    instruction = _text(_field(record, col["instruction"]), "instruction")
    extra = record.get(col["input"]) if col.get("input") else None
    user = f"{instruction}\n\n{extra}" if isinstance(extra, str) and extra.strip() else instruction
    output = _text(_field(record, col["output"]), "output")
    return [{"role": "user", "content": user}, {"role": "assistant", "content": output}], None, None


def _read_prompt_completion(record: dict, col: dict) -> Read:
    prompt = _turns_of(_field(record, col["prompt"]), "user")
    return prompt + _turns_of(_field(record, col["completion"]), "assistant"), None, None


def _read_question_answer(record: dict, col: dict) -> Read:
    question = _text(_field(record, col["question"]), "question")
    answer = _optional_text(record.get(col["answer"]))
    conversation = [{"role": "user", "content": question}]
    reasoning = record.get(col["reasoning"]) if col.get("reasoning") else None
    if answer:  # a reasoning trace goes before the answer in a <think> block, as hybrid models train
        reply = f"<think>\n{reasoning.strip()}\n</think>\n\n{answer}" if reasoning else answer
        conversation.append({"role": "assistant", "content": reply})
    return conversation, answer, None


def _read_prompt_only(record: dict, col: dict) -> Read:
    value = _field(record, col["prompt"])
    if isinstance(value, str) and "\n\nAssistant:" in value:  # an HH-RLHF transcript: up to its last Human turn
        turns = parse_hh_transcript(value)
        last_user = max((i for i, m in enumerate(turns) if m["role"] == "user"), default=-1)
        return turns[: last_user + 1], None, None
    return _turns_of(value, "user"), None, None


def _read_prompt(record: dict, col: dict) -> Read:
    expected = _optional_text(record.get(col["expected_output"])) if col.get("expected_output") else None
    return _turns_of(_field(record, col["prompt"]), "user"), expected or None, None


def _pair_of_conversations(chosen_all: Messages, rejected_all: Messages, what: str):
    """Prompt, chosen and rejected of two whole conversations: their last assistant turns after
    the shared prefix (the chosen one's turns before its last reply)."""
    prompt, chosen = split_last_assistant(chosen_all)
    _, rejected = split_last_assistant(rejected_all)
    if chosen is None or rejected is None:
        raise BadRow(f"chosen or rejected {what} has no assistant turn")
    return prompt, [{"role": "assistant", "content": chosen}], [{"role": "assistant", "content": rejected}]


def _read_preference(record: dict, col: dict) -> Read:
    chosen_raw, rejected_raw = _field(record, col["chosen"]), _field(record, col["rejected"])
    prompt_raw = record.get(col["prompt"]) if col.get("prompt") else None
    if prompt_raw is None and isinstance(chosen_raw, str) and "\n\nAssistant:" in chosen_raw:
        pair = _pair_of_conversations(parse_hh_transcript(chosen_raw), parse_hh_transcript(rejected_raw), "transcript")
        return None, None, pair
    full = isinstance(chosen_raw, list) and any(isinstance(m, dict) and m.get("role") == "user" for m in chosen_raw)
    if isinstance(chosen_raw, list) and (prompt_raw is None or full):
        # full conversations (UltraFeedback, Tulu 3 preferences: a `prompt` column beside them repeats
        # their first user turn): the shared prefix is the prompt
        return None, None, _pair_of_conversations(read_turns(chosen_raw), read_turns(rejected_raw), "conversation")
    if prompt_raw is None:
        raise BadRow("preference row without a prompt")
    prompt = _turns_of(prompt_raw, "user")
    return None, None, (prompt, _turns_of(chosen_raw, "assistant"), _turns_of(rejected_raw, "assistant"))


# --- the table: detection tries the entries in this order ----------------------------------


def _sharegpt_turns(first: FirstRow) -> bool:
    turns = first.row.get(first.conversation) or []
    return bool(turns) and isinstance(turns[0], dict) and "from" in turns[0]


FORMATS: dict[str, SourceFormat] = {
    "sharegpt": SourceFormat(
        {"conversations": ("conversations", "conversation", "messages")},
        lambda first: first.conversation is not None and _sharegpt_turns(first), _read_sharegpt),
    "prompt_only": SourceFormat(
        {"prompt": ("prompt", "messages")},
        lambda first: (first.conversation is not None and first.kind == "rl"
                       and first.fields.get("prompt") == first.conversation),
        _read_prompt_only),
    "messages": SourceFormat(
        {"messages": CONVERSATION_COLUMNS}, lambda first: first.conversation is not None, _read_messages),
    "preference": SourceFormat(
        {"prompt": ("prompt",), "chosen": ("chosen",), "rejected": ("rejected",)},
        lambda first: {"chosen", "rejected"} <= first.names, _read_preference, optional=frozenset({"prompt"})),
    "alpaca": SourceFormat(
        {"instruction": ("instruction",), "input": ("input",), "output": ("output",)},
        lambda first: {"instruction", "output"} <= first.names, _read_alpaca, optional=frozenset({"input"})),
    "prompt_completion": SourceFormat(
        {"prompt": ("prompt",), "completion": ("completion",)},
        lambda first: {"prompt", "completion"} <= first.names, _read_prompt_completion),
    "question_answer": SourceFormat(
        {"question": ("question", "problem", "query"), "answer": ("answer", "solution", "response"),
         "reasoning": ()},  # only through `fields:` (e.g. s1K's deepseek_thinking_trajectory)
        lambda first: bool(first.names & {"question", "problem", "query"} and first.names & {"answer", "solution", "response"}),
        _read_question_answer, optional=frozenset({"reasoning"})),
    # detected, not declared: rows that already hold `prompt` (say, an rl shard mixed again) are
    # normalised in place, and their `expected_output` column, if any, is kept as the answer
    "prompt": SourceFormat(
        {"prompt": ("prompt",), "expected_output": ("expected_output",)},
        lambda first: "prompt" in first.names, _read_prompt, optional=frozenset({"expected_output"}), declared=False),
}
DECLARED_FORMATS = tuple(name for name, fmt in FORMATS.items() if fmt.declared)


def detect_format(spec: DeclaredSource, first: dict, kind: Kind) -> str:
    """The source's format: the catalog's `format:`, or the first entry of FORMATS that
    recognises its first row."""
    if spec.format != "auto":
        return spec.format
    seen = FirstRow(first, spec.fields, kind)
    found = next((name for name, fmt in FORMATS.items() if fmt.detect(seen)), None)
    if found is None:
        raise RufusError(
            f"source '{spec.name}': cannot detect its format from the fields {sorted(first)}; set `format:` "
            f"({', '.join(DECLARED_FORMATS)}) and, if the columns are named differently, a `fields:` map"
        )
    return found


def resolve_columns(spec: DeclaredSource, fmt: str, first: dict) -> dict[str, str | None]:
    """Canonical field -> source column for this format (the catalog's `fields:` map wins)."""
    columns: dict[str, str | None] = {}
    source_format = FORMATS[fmt]
    for canonical, candidates in source_format.fields.items():
        if canonical in spec.fields:
            columns[canonical] = spec.fields[canonical]
            continue
        columns[canonical] = next((c for c in candidates if c in first), None)
        if columns[canonical] is None and canonical not in source_format.optional:
            raise RufusError(
                f"source '{spec.name}' ({fmt} format): no column for '{canonical}' among {sorted(first)}; "
                f"add `fields: {{{canonical}: <column>}}` to the source"
            )
    return columns
