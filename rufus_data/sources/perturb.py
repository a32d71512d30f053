"""A wrong final answer that keeps the reasoning: Tulu 3's rejected answers for GSM8K-style
preference pairs (`rufus-data pairs --perturb-answer`, the `perturbed_answer_pairs` builder and the
training examples all use this one function)."""

from __future__ import annotations

import random
import re

_NUMBER = r"[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?"
_FINAL_PATTERNS = (
    re.compile(r"####\s*\$?(" + _NUMBER + ")"),
    re.compile(r"\\boxed\{\s*(" + _NUMBER + r")\s*\}"),
    re.compile(r"(" + _NUMBER + ")"),
)


def perturb_final_answer(text: str, rng: random.Random) -> str | None:
    """`text` with only its final answer changed to another number (None: no number to change).

    The final answer is the number after the last `####`, else in the last `\\boxed{}`, else the
    last number in the text; it moves by a random non-zero amount, keeping its sign and decimals."""
    for pattern in _FINAL_PATTERNS:
        matches = list(pattern.finditer(text))
        if matches:
            match = matches[-1]
            break
    else:
        return None
    original = match.group(1)
    plain = original.replace(",", "")
    decimals = len(plain.split(".", 1)[1]) if "." in plain else 0
    value = float(plain)
    delta = rng.choice([d for d in range(-10, 11) if d != 0])
    new = value + delta
    if value >= 0 and new < 0:
        new = value + abs(delta)
    replacement = f"{new:.{decimals}f}" if decimals else str(round(new))
    if plain.startswith("+"):
        replacement = "+" + replacement
    return text[: match.start(1)] + replacement + text[match.end(1) :]
