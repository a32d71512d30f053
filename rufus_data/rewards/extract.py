"""Answer extraction and normalisation: the one place that decides what "the answer" of a completion is.

`strip_reasoning` is the single `<think>` rule shared by the rewards and by rufus-eval: reasoning is
never part of the answer, and a completion whose `<think>` block never closes has no answer at all.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from fractions import Fraction

from rufus_data.base.errors import RufusError

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
    - `<think>` that never closes: (everything after `<think>`, "", False): no answer. That includes a
      second `<think>` opened after the last `</think>` (the model went back to reasoning and ran out).
    A bare `</think>` without an opening tag (chat templates that put `<think>` in the prompt) also
    counts as a closed reasoning block: only the text after it is the answer.
    """
    close = text.rfind(THINK_CLOSE)
    reopened = text.rfind(THINK_OPEN)
    if 0 <= close < reopened:
        return text[reopened + len(THINK_OPEN):].strip(), "", False
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
    r"""Content of the LAST `\boxed{...}` (or `\fbox{...}`), scanning braces so nesting works.

    When that last box never closes (a truncated completion), there is no answer: an earlier closed box
    is not taken instead, since the model was still replacing it."""
    last = -1  # position of the `{` that opens the last box
    for marker in ("\\boxed", "\\fbox"):
        idx = text.rfind(marker)
        while idx >= 0:
            brace = _brace_start(text, idx + len(marker))
            if brace is not None:
                last = max(last, brace)
                break
            idx = text.rfind(marker, 0, idx)  # a bare `\boxed` mentioned in prose: look further back
    return None if last < 0 else _braced_content(text, last)


def _brace_start(text: str, pos: int) -> int | None:
    """Position of the `{` at `pos` (spaces allowed before it), or None."""
    while pos < len(text) and text[pos] == " ":
        pos += 1
    return pos if pos < len(text) and text[pos] == "{" else None


def _braced_content(text: str, pos: int) -> str | None:
    """The content of the balanced `{...}` group starting at `pos` (spaces allowed before `{`)."""
    pos = _brace_start(text, pos)
    if pos is None:
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


# A sign counts only where it cannot be a hyphen or an operator between numbers (`2023-2024`, `x-3`).
# Digits joined by commas are one token: `1,234` (thousands; normalisation drops the comma) and `3,50`
# (a decimal comma or a list, kept whole: never read as 50).
_NUMBER = re.compile(r"(?:(?<![\w.])[-+])?(?:\d+(?:,\d+)*(?:\.\d+)?|\.\d+)")


def extract_last_number(text: str) -> str | None:
    """The last numeric token: optional sign, comma-joined digit groups, optional decimal part."""
    last = None
    for last in _NUMBER.finditer(text):
        pass
    return None if last is None else last.group(0)


# ---------------------------------------------------------------- the final number (eval scoring)

# What published GSM8K-style evaluations read as the final answer: the text after the last of these
# markers (GSM8K's `####`, the "The answer is" of chain-of-thought prompts, a `\boxed{}`), else the
# last number of the response.
_ANSWER_MARKER = re.compile(r"####|\bthe (?:final )?answer is\b\s*:?", re.IGNORECASE)
# A number token as `_NUMBER`, or a fraction of two (`1/4`: GSM-Plus golds hold a few).
_NUMBER_OR_FRACTION = re.compile(rf"{_NUMBER.pattern}(?:/\d+)?")


def final_answer_text(text: str) -> str | None:
    """The text the final answer is read from: after the last answer marker (to the end of that line,
    or the line after when the marker ends its line), the last box's content; None without a marker."""
    candidates = []
    markers = list(_ANSWER_MARKER.finditer(text))
    if markers:
        rest = text[markers[-1].end():].lstrip()
        candidates.append((markers[-1].start(), rest.split("\n", 1)[0]))
    box = extract_boxed(text)
    if box is not None:
        candidates.append((max(text.rfind("\\boxed"), text.rfind("\\fbox")), box))
    return max(candidates)[1] if candidates else None


def extract_final_number(text: str) -> str | None:
    """The final answer's number: the first number after the last answer marker (after the last `=` of
    that line: `#### 5 + 3 = 8 apples` is 8), so words and units after it do not count (`#### 7 dozen
    eggs in 4 weeks` is 7); without a marker, or with no number after it, the last number of the text."""
    marked = final_answer_text(text)
    if marked is not None:
        found = _NUMBER_OR_FRACTION.search(marked.rsplit("=", 1)[-1])
        if found:
            return found.group(0)
    last = None
    for last in _NUMBER_OR_FRACTION.finditer(text):
        pass
    return None if last is None else last.group(0)


def number_value(token: str | None) -> Fraction | None:
    """A number token as an exact value: `16.00` == `16`, `1,000` == `1000`, `1/4` == `0.25`; None if none."""
    if token is None:
        return None
    try:
        return Fraction(token.replace(",", "").lstrip("+"))
    except (ValueError, ZeroDivisionError):
        return None


def format_number(value: Fraction) -> str:
    """One spelling per value (what maj@ votes on): `16`, `0.25`, `1/3`."""
    if value.denominator == 1:
        return str(value.numerator)
    as_float = float(value)
    return repr(as_float) if Fraction(repr(as_float)) == value else str(value)


def extract_full(text: str) -> str | None:
    """The whole completion, unchanged (normalisation still applies when comparing)."""
    return text


# "The answer is (B)", "Answer: B", "**Answer:** (B)": the letter after the last such phrase
_ANSWER_LETTER = re.compile(r"(?i:answer)(?:\s+is)?\s*[:：]?\s*\**\s*\(?([A-J])\b\)?")
_PAREN_LETTER = re.compile(r"\(([A-J])\)")


def extract_choice_letter(text: str) -> str | None:
    """A multiple-choice answer letter (A-J): after the last "answer is"/"Answer:", else the last "(X)"
    (GPQA's and Global MMLU's prompts ask for "The answer is (X)"; lm-eval's flexible match)."""
    for pattern in (_ANSWER_LETTER, _PAREN_LETTER):
        found = [m.group(1) for m in pattern.finditer(text)]
        if found:
            return found[-1].upper()
    return None


EXTRACTORS: dict[str, Callable[[str], str | None]] = {
    "boxed": extract_boxed,
    "gsm8k": extract_gsm8k,
    "last_number": extract_last_number,
    "full": extract_full,
    "choice_letter": extract_choice_letter,
}


def get_extractor(name: str) -> Callable[[str], str | None]:
    try:
        return EXTRACTORS[name]
    except KeyError:
        raise RufusError(f"unknown extractor {name!r}: use one of {', '.join(EXTRACTORS)}") from None


# ---------------------------------------------------------------- normalisation

_WHITESPACE = re.compile(r"\s+")
_THOUSANDS = re.compile(r"(?<=\d),(?=\d{3}(?!\d))")


def normalise_answer(answer: str) -> str:
    """Normalise one answer string; both sides go through this before the exact comparison.

    strip; collapse inner whitespace; lowercase; drop a trailing `.`; drop thousands-separator commas
    inside numbers; drop surrounding `$` or `\\$`; drop surrounding `{}`. The wrapper steps repeat until
    nothing changes, so `{7}.`, `$5$` and `\\$1,000.` all reduce fully. A `$` / `\\$` is dropped at
    either end on its own too (symmetric): `$5` is a currency amount (GSM8K-style) and `5$` a math-mode
    delimiter cut in half, and neither is part of the answer.
    """
    text = _WHITESPACE.sub(" ", answer.strip()).lower()
    text = _THOUSANDS.sub("", text)
    previous = None
    while text != previous:
        previous = text
        text = text.strip()
        if text.endswith(".") and not text.endswith(".."):
            text = text[:-1].rstrip()
        text = _strip_dollar_prefix(text)
        text = _strip_dollar_suffix(text)
        if len(text) >= 2 and text[0] == "{" and text[-1] == "}" and _braced_content(text, 0) == text[1:-1]:
            text = text[1:-1]
    return text


def _strip_dollar_prefix(text: str) -> str:
    for sign in ("\\$", "$"):
        if text.startswith(sign):
            return text[len(sign):]
    return text


def _strip_dollar_suffix(text: str) -> str:
    for sign in ("\\$", "$"):
        if text.endswith(sign):
            return text[: -len(sign)]
    return text
