"""vibe.html: the vibe test's answers in a browser, one card per prompt with each checkpoint's
answer in a column beside the others (rufus_data/folders/review_page.py writes the page), where a
terminal table wraps long answers out of sight."""

from __future__ import annotations

from pathlib import Path

from rufus_data.base.console import print_result
from rufus_data.folders.review_page import card, escape, page

EMPTY_REPLY = "<em>(empty reply: the model ended its turn at once)</em>"


def reply_html(reply: str) -> str:
    """A reply as the page shows it: an empty one said so, not a blank box."""
    return escape(reply) if reply.strip() else EMPTY_REPLY


def vibe_page(prompts: list[str], answers: dict[str, list[str]], systems: list[str | None] | None = None) -> str:
    """The page: `prompts` as shown to a reader, `answers` checkpoint -> one answer per prompt,
    `systems` the system prompt each prompt was asked under (what the vibe test checks)."""
    systems = systems or [None] * len(prompts)
    cards = [card({"prompt": str(i + 1)}, f"prompt {i + 1}: <b>{escape(prompt)}</b>"
                  + (f"<br>system: <i>{escape(system)}</i>" if system else "<br>system: <i>(none)</i>"),
                  [(ckpt, reply_html(answers[ckpt][i])) for ckpt in answers])
             for i, (prompt, system) in enumerate(zip(prompts, systems, strict=True))]
    intro = f"{len(prompts)} prompts answered by {len(answers)} checkpoints: {', '.join(answers)}."
    return page("vibe test", escape(intro), {"prompt": ("prompt", [str(i + 1) for i in range(len(prompts))])}, cards)


def write_vibe_page(path: str | Path, prompts: list[str], answers: dict[str, list[str]],
                    systems: list[str | None] | None = None) -> Path:
    """Write the page and say where it is."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(vibe_page(prompts, answers, systems))
    print_result(f"side-by-side answers: {path}")
    return path
