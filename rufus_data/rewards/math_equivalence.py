"""math-verify based equivalence (`0.5` == `1/2` == `\\frac{1}{2}`), for gold answers not in a canonical form.

Slower than string-match (sympy parsing) and depends on math-verify; its timeouts use SIGALRM, which only
works in the main thread, so off the main thread it runs without them.
"""

from __future__ import annotations

import re
import threading

from rufus_data.rewards.contract import RewardFunction, is_missing
from rufus_data.rewards.extract import extract_boxed

_MATH_DELIMITER = re.compile(r"(?<!\\)\$")  # a `$` that opens or closes math; `\$` is a dollar sign


class MathEquivalenceReward(RewardFunction):
    """1.0 when math-verify finds the answer equivalent to the gold one, else 0.0; None when unscorable."""

    # math-verify reads the answer from the last box first; votes (maj@N) go to that box
    answer_extractor = staticmethod(extract_boxed)

    def __init__(self, answer_column: str = "solution", only_label: str | None = None, timeout_s: int = 5):
        self.answer_column = answer_column
        self.timeout_s = timeout_s
        self.name = "math_equivalence"
        super().__init__(only_label=only_label)

    def score_rows(self, prompts, texts, closed, rows, log_metric):
        self.warn_missing_column(rows, self.answer_column, "the gold answer; set answer_column to the column that holds it")
        from math_verify import parse, verify  # sympy and antlr: loaded on first use, not with the registry

        timeout = self.timeout_s if threading.current_thread() is threading.main_thread() else None
        scores: list[float | None] = []
        for text, ok, row in zip(texts, closed, rows):
            gold_text = row.get(self.answer_column)
            if is_missing(gold_text):
                scores.append(None)
                continue
            if not ok:
                scores.append(0.0)
                continue
            gold_text = str(gold_text)
            if "\\boxed" not in gold_text and not _MATH_DELIMITER.search(gold_text):
                gold_text = f"${gold_text}$"  # a bare answer like 1/2, \frac{1}{2} or \$18.90 (an escaped dollar)
            gold = parse(gold_text, parsing_timeout=timeout)
            if not gold:
                scores.append(None)
                continue
            answer = parse(text, parsing_timeout=timeout)
            scores.append(1.0 if answer and verify(gold, answer, timeout_seconds=timeout) else 0.0)
        return scores
