"""vibe.html: the vibe test's answers in a browser, one card per prompt with each checkpoint's
answer in a column beside the others (rufus_data/folders/review_page.py writes the page), where a
terminal table wraps long answers out of sight."""

from __future__ import annotations

from pathlib import Path

from rufus_data.base.console import print_result
from rufus_data.folders.review_page import card, escape, page


def vibe_page(prompts: list[str], answers: dict[str, list[str]]) -> str:
    """The page: `prompts` as shown to a reader, `answers` checkpoint -> one answer per prompt."""
    cards = [card({"prompt": str(i + 1)}, f"prompt {i + 1}: <b>{escape(prompt)}</b>",
                  [(ckpt, escape(answers[ckpt][i])) for ckpt in answers])
             for i, prompt in enumerate(prompts)]
    intro = f"{len(prompts)} prompts answered by {len(answers)} checkpoints: {', '.join(answers)}."
    return page("vibe test", escape(intro), {"prompt": ("prompt", [str(i + 1) for i in range(len(prompts))])}, cards)


def write_vibe_page(path: str | Path, prompts: list[str], answers: dict[str, list[str]]) -> Path:
    """Write the page and say where it is."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(vibe_page(prompts, answers))
    print_result(f"side-by-side answers: {path}")
    return path
