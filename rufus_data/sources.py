"""Sources: open a catalog source (rufus_data.dataset_source finds where its rows are; a
fallback and a builder step may stand in) and turn its rows into canonical rows.

Canonical rows carry `id` (source name + row number: stable across runs), `source`, `label`,
then the columns of the catalog's kind (`rufus_data.shards.KIND_COLUMNS`). Every column the
format does not consume passes through untouched (a column that would clash with a canonical
name is kept as `orig_<name>`)."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass

from rufus_data.builders import BUILDERS, build_rows
from rufus_data.catalog import SourceRows, SourceSpec
from rufus_data.console import console
from rufus_data.dataset_source import DatasetUnavailable, load_rows
from rufus_data.errors import RufusError
from rufus_data.shards import CANONICAL_COLUMNS, Kind

THINK_BLOCK = re.compile(r"<think>.*?</think>\s*", re.DOTALL)
HH_TURN = re.compile(r"\n\n(Human|Assistant): ")

# Canonical field -> column names tried in order when the catalog gives no `fields:` map.
FORMAT_FIELDS: dict[str, dict[str, tuple[str, ...]]] = {
    "messages": {"messages": ("messages", "conversations", "conversation")},
    "sharegpt": {"conversations": ("conversations", "conversation", "messages")},
    "alpaca": {"instruction": ("instruction",), "input": ("input",), "output": ("output",)},
    "prompt_completion": {"prompt": ("prompt",), "completion": ("completion",)},
    "question_answer": {
        "question": ("question", "problem", "query"),
        "answer": ("answer", "solution", "response"),
        "reasoning": (),  # only through `fields:` (e.g. s1K's deepseek_thinking_trajectory)
    },
    "preference": {"prompt": ("prompt",), "chosen": ("chosen",), "rejected": ("rejected",)},
    "prompt_only": {"prompt": ("prompt", "messages")},
    # detected, not declared: rows that already hold `prompt` (say, an rl shard mixed again) are
    # normalised in place, and their `expected_output` column, if any, is kept as the answer
    "prompt": {"prompt": ("prompt",), "expected_output": ("expected_output",)},
}
# alpaca input, preference prompt and a prompt row's answer may be absent
OPTIONAL_FIELDS = {"input", "prompt", "expected_output", "reasoning"}
SHAREGPT_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant",
                  "system": "system", "tool": "tool", "function_response": "tool", "observation": "tool"}


class BadRow(ValueError):
    """A row that lacks what its format needs; collected and reported by row number."""


@dataclass
class OpenedSource:
    """A source ready to read: the spec it loads as (its fallback's places, build, format and
    fields when the fallback stood in), its raw rows, and where they came from."""

    spec: SourceSpec
    rows: Iterator[dict]
    provenance: dict  # rufus_data.dataset_source provenance, plus `fallback` and `build` when used
    count: int | None = None  # raw rows to expect (None: unknown until read)


def open_source(spec: SourceSpec) -> OpenedSource:
    """Find the first place of the source that loads; if none does and the source has a
    `fallback:`, the fallback's. Says so on the console and in the provenance. A builder step
    (`build:`) then makes the source's rows from what loaded."""
    what = f"source '{spec.name}'"
    try:
        loaded = load_rows(spec, what)
    except DatasetUnavailable as err:
        if spec.fallback is None:
            raise
        fallback = spec.fallback
        loaded = load_rows(fallback, f"{what} (fallback)")
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
    return OpenedSource(spec, rows, loaded.provenance, count)


def _describe(rows: SourceRows) -> str:
    """`build(origin)` or the origin, as the catalog writes them."""
    origin = rows.path or (f"$RUFUS_DATA_ROOT/{rows.local}" if rows.local else None) or (
        f"hub {rows.hub.describe()}" if rows.hub else "?")
    return f"{rows.build} built from {origin}" if rows.build else origin


def detect_format(spec: SourceSpec, first: dict, kind: Kind) -> str:
    """Pick the source format from the fields of its first row (or trust the catalog)."""
    if spec.format != "auto":
        return spec.format
    keys = set(first) | set(spec.fields.values())
    mapped = set(spec.fields)
    conv = next((k for k in ("messages", "conversations", "conversation") if k in keys), None)
    if conv is not None:
        turns = first.get(conv) or []
        if turns and isinstance(turns[0], dict) and "from" in turns[0]:
            return "sharegpt"
        return "prompt_only" if kind == "rl" and spec.fields.get("prompt") == conv else "messages"
    if {"chosen", "rejected"} <= keys | mapped:
        return "preference"
    if {"instruction", "output"} <= keys | mapped:
        return "alpaca"
    if {"prompt", "completion"} <= keys | mapped:
        return "prompt_completion"
    if (keys | mapped) & {"question", "problem", "query"} and (keys | mapped) & {"answer", "solution", "response"}:
        return "question_answer"
    if "prompt" in keys | mapped:
        return "prompt"
    raise RufusError(
        f"source '{spec.name}': cannot detect its format from the fields {sorted(first)}; set `format:` "
        "(messages, alpaca, sharegpt, prompt_completion, question_answer, preference, prompt_only) "
        "and, if the columns are named differently, a `fields:` map"
    )


def resolve_columns(spec: SourceSpec, fmt: str, first: dict) -> dict[str, str | None]:
    """Canonical field -> source column for this format (the catalog's `fields:` map wins)."""
    columns: dict[str, str | None] = {}
    for canonical, candidates in FORMAT_FIELDS[fmt].items():
        if canonical in spec.fields:
            columns[canonical] = spec.fields[canonical]
            continue
        columns[canonical] = next((c for c in candidates if c in first), None)
        if columns[canonical] is None and canonical not in OPTIONAL_FIELDS:
            raise RufusError(
                f"source '{spec.name}' ({fmt} format): no column for '{canonical}' among {sorted(first)}; "
                f"add `fields: {{{canonical}: <column>}}` to the source"
            )
    return columns


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
        conversation, expected, pair = self._read(record)
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
            prompt, last = (conversation, None) if ends_with_user else _split_last_assistant(conversation)
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

    def _read(self, record: dict):
        """-> (conversation or None, expected answer or None, (prompt, chosen, rejected) or None)."""
        col = self.columns
        fmt = self.fmt
        if fmt in ("messages", "sharegpt"):
            turns = _field(record, col["messages" if fmt == "messages" else "conversations"])
            return _messages(turns, sharegpt=fmt == "sharegpt"), None, None
        if fmt == "alpaca":
            instruction = _text(_field(record, col["instruction"]), "instruction")
            extra = record.get(col["input"]) if col.get("input") else None
            user = f"{instruction}\n\n{extra}" if isinstance(extra, str) and extra.strip() else instruction
            output = _text(_field(record, col["output"]), "output")
            return [{"role": "user", "content": user}, {"role": "assistant", "content": output}], None, None
        if fmt == "prompt_completion":
            prompt = _as_messages(_field(record, col["prompt"]), "user")
            completion = _as_messages(_field(record, col["completion"]), "assistant")
            return prompt + completion, None, None
        if fmt == "question_answer":
            question = _text(_field(record, col["question"]), "question")
            answer = _optional_text(record.get(col["answer"]))
            conversation = [{"role": "user", "content": question}]
            reasoning = record.get(col["reasoning"]) if col.get("reasoning") else None
            if answer:  # a reasoning trace goes before the answer in a <think> block, as hybrid models train
                reply = f"<think>\n{reasoning.strip()}\n</think>\n\n{answer}" if reasoning else answer
                conversation.append({"role": "assistant", "content": reply})
            return conversation, answer, None
        if fmt == "prompt_only":
            value = _field(record, col["prompt"])
            if isinstance(value, str) and "\n\nAssistant:" in value:  # an HH-RLHF transcript: up to its last Human turn
                turns = parse_hh_transcript(value)
                last_user = max((i for i, m in enumerate(turns) if m["role"] == "user"), default=-1)
                return turns[: last_user + 1], None, None
            return _as_messages(value, "user"), None, None
        if fmt == "prompt":
            expected = _optional_text(record.get(col["expected_output"])) if col.get("expected_output") else None
            return _as_messages(_field(record, col["prompt"]), "user"), expected or None, None
        if fmt == "preference":
            return None, None, _preference(record, col)
        raise BadRow(f"unknown format {fmt}")


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


def _content(value) -> str:
    """Message content as text: strings stay, lists of parts keep their text parts."""
    if isinstance(value, str):
        return value
    if value is None:
        return ""
    if isinstance(value, list):
        return "".join(p.get("text", "") if isinstance(p, dict) else str(p) for p in value)
    return str(value)


def _messages(turns, sharegpt: bool = False) -> list[dict]:
    if not isinstance(turns, list) or not turns:
        raise BadRow("conversation is empty or not a list")
    out = []
    for turn in turns:
        if not isinstance(turn, dict):
            raise BadRow("a turn is not an object")
        if sharegpt:
            role = SHAREGPT_ROLES.get(str(turn.get("from", "")).lower())
            content = turn.get("value")
        else:
            role, content = turn.get("role"), turn.get("content")
        if role not in ("system", "user", "assistant", "tool"):
            raise BadRow(f"unknown role {role!r}")
        out.append({"role": role, "content": _content(content)})
    return out


def _as_messages(value, role: str) -> list[dict]:
    if isinstance(value, str):
        return [{"role": role, "content": _text(value, role)}]
    return _messages(value)


def _optional_text(value) -> str | None:
    """An answer cell as text: numbers (GSM8K-style int answers) become strings, null stays null."""
    return value if value is None or isinstance(value, str) else str(value)


def _split_last_assistant(conversation: list[dict]) -> tuple[list[dict], str | None]:
    """prompt = the turns before the last assistant turn; expected = that turn's content (or None)."""
    for i in range(len(conversation) - 1, -1, -1):
        if conversation[i]["role"] == "assistant":
            return conversation[:i], conversation[i]["content"]
    return conversation, None


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


def parse_hh_transcript(text: str) -> list[dict]:
    """'\\n\\nHuman: ...\\n\\nAssistant: ...' transcripts (HH-RLHF) as messages."""
    parts = HH_TURN.split(text)
    messages = []
    for speaker, content in zip(parts[1::2], parts[2::2], strict=False):
        messages.append({"role": "user" if speaker == "Human" else "assistant", "content": content.strip()})
    if not messages:
        raise BadRow("transcript has no Human:/Assistant: turns")
    return messages


def _pair_of_conversations(chosen_all: list[dict], rejected_all: list[dict], what: str):
    """Prompt, chosen and rejected of two whole conversations: their last assistant turns after
    the shared prefix (the chosen one's turns before its last reply)."""
    prompt, chosen = _split_last_assistant(chosen_all)
    _, rejected = _split_last_assistant(rejected_all)
    if chosen is None or rejected is None:
        raise BadRow(f"chosen or rejected {what} has no assistant turn")
    return prompt, [{"role": "assistant", "content": chosen}], [{"role": "assistant", "content": rejected}]


def _preference(record: dict, col: dict) -> tuple[list[dict], list[dict], list[dict]]:
    chosen_raw, rejected_raw = _field(record, col["chosen"]), _field(record, col["rejected"])
    prompt_raw = record.get(col["prompt"]) if col.get("prompt") else None
    if prompt_raw is None and isinstance(chosen_raw, str) and "\n\nAssistant:" in chosen_raw:
        return _pair_of_conversations(parse_hh_transcript(chosen_raw), parse_hh_transcript(rejected_raw), "transcript")
    full = isinstance(chosen_raw, list) and any(isinstance(m, dict) and m.get("role") == "user" for m in chosen_raw)
    if isinstance(chosen_raw, list) and (prompt_raw is None or full):
        # full conversations (UltraFeedback, Tulu 3 preferences: a `prompt` column beside them repeats
        # their first user turn): the shared prefix is the prompt
        return _pair_of_conversations(_messages(chosen_raw), _messages(rejected_raw), "conversation")
    if prompt_raw is None:
        raise BadRow("preference row without a prompt")
    prompt = _as_messages(prompt_raw, "user")
    return prompt, _as_messages(chosen_raw, "assistant"), _as_messages(rejected_raw, "assistant")
