"""Answer extraction and normalisation: the one place that decides what "the answer" of a completion is.

`strip_reasoning` is the single `<think>` rule shared by the rewards and by rufus-eval: reasoning is
never part of the answer, and a completion whose `<think>` block never closes has no answer at all.
"""

from __future__ import annotations

import re
from collections.abc import Callable

THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"


def completion_text(completion) -> str:
    """The text of one completion as TRL passes it: a string, or a list of message dicts (conversational).

    For conversational completions the assistant turns are joined (normally there is exactly one).
    """
    if completion is None:
        return ""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, dict):
        return str(completion.get("content") or "")
    parts = []
    for message in completion:
        if isinstance(message, dict) and message.get("role", "assistant") == "assistant":
            parts.append(str(message.get("content") or ""))
    return "\n".join(parts)


def split_reasoning(text: str) -> tuple[str | None, str, bool]:
    """Split a completion into (reasoning, answer_text, closed).

    - no `<think>` at all: (None, text, True)
    - `<think>...</think>rest`: (the reasoning, rest after the LAST `</think>`, True)
    - `<think>` that never closes: (everything after `<think>`, "", False): no answer.
    A bare `</think>` without an opening tag (chat templates that put `<think>` in the prompt) also
    counts as a closed reasoning block: only the text after it is the answer.
    """
    close = text.rfind(THINK_CLOSE)
    if close >= 0:
        open_ = text.find(THINK_OPEN)
        start = open_ + len(THINK_OPEN) if 0 <= open_ < close else 0
        return text[start:close].strip(), text[close + len(THINK_CLOSE):], True
    open_ = text.find(THINK_OPEN)
    if open_ >= 0:
        return text[open_ + len(THINK_OPEN):].strip(), "", False
    return None, text, True


def strip_reasoning(text: str) -> tuple[str, bool]:
    """(answer_text, closed): the text after the reasoning block; closed=False means an unclosed `<think>`."""
    _, answer, closed = split_reasoning(text)
    return answer, closed


# ---------------------------------------------------------------- extractors


def extract_boxed(text: str) -> str | None:
    r"""Content of the LAST `\boxed{...}` (or `\fbox{...}`), scanning braces so nesting works."""
    best = None
    for marker in ("\\boxed", "\\fbox"):
        idx = text.rfind(marker)
        while idx >= 0:
            content = _braced_content(text, idx + len(marker))
            if content is not None:
                if best is None or idx > best[0]:
                    best = (idx, content)
                break
            idx = text.rfind(marker, 0, idx)
    return None if best is None else best[1]


def _braced_content(text: str, pos: int) -> str | None:
    """The content of the balanced `{...}` group starting at `pos` (spaces allowed before `{`)."""
    while pos < len(text) and text[pos] == " ":
        pos += 1
    if pos >= len(text) or text[pos] != "{":
        return None
    depth = 0
    for end in range(pos, len(text)):
        char = text[end]
        if char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
            if depth == 0:
                return text[pos + 1:end]
    return None  # unbalanced: the box never closes


def extract_gsm8k(text: str) -> str | None:
    """The text after the last `####` (up to the end of that line)."""
    idx = text.rfind("####")
    if idx < 0:
        return None
    answer = text[idx + 4:].strip().split("\n", 1)[0].strip()
    return answer or None


_NUMBER = re.compile(r"[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|[-+]?\.\d+")


def extract_last_number(text: str) -> str | None:
    """The last numeric token: optional sign, thousands commas allowed, optional decimal part."""
    last = None
    for last in _NUMBER.finditer(text):
        pass
    return None if last is None else last.group(0)


def extract_full(text: str) -> str | None:
    """The whole completion, unchanged (normalisation still applies when comparing)."""
    return text


EXTRACTORS: dict[str, Callable[[str], str | None]] = {
    "boxed": extract_boxed,
    "gsm8k": extract_gsm8k,
    "last_number": extract_last_number,
    "full": extract_full,
}


def get_extractor(name: str) -> Callable[[str], str | None]:
    try:
        return EXTRACTORS[name]
    except KeyError:
        from rufus_data.errors import RufusError

        raise RufusError(f"unknown extractor {name!r}: use one of {', '.join(EXTRACTORS)}") from None


# ---------------------------------------------------------------- normalisation

_WHITESPACE = re.compile(r"\s+")
_THOUSANDS = re.compile(r"(?<=\d),(?=\d{3}(?!\d))")


def normalize_answer(answer: str) -> str:
    """Normalise one answer string; both sides go through this before the exact comparison.

    strip; collapse inner whitespace; lowercase; drop a trailing `.`; drop thousands-separator commas
    inside numbers; drop surrounding `$` or `\\$`; drop surrounding `{}`. The wrapper steps repeat until
    nothing changes, so `{7}.`, `$5$` and `\\$1,000.` all reduce fully.
    """
    text = _WHITESPACE.sub(" ", answer.strip()).lower()
    text = _THOUSANDS.sub("", text)
    previous = None
    while text != previous:
        previous = text
        text = text.strip()
        if text.endswith(".") and not text.endswith(".."):
            text = text[:-1].rstrip()
        if text.startswith("\\$"):
            text = text[2:]
            text = text.removesuffix("\\$")
        elif text.startswith("$"):
            text = text[1:]
            text = text.removesuffix("$")
        if len(text) >= 2 and text[0] == "{" and text[-1] == "}" and _braced_content(text, 0) == text[1:-1]:
            text = text[1:-1]
    return text
