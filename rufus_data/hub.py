"""Hub revisions: a number is reproducible only when the data it came from is pinned to a commit."""

from __future__ import annotations

import re
import warnings

COMMIT = re.compile(r"[0-9a-f]{40}")


def warn_if_unpinned(what: str, repo: str, revision: str | None, consequence: str, where: str = "") -> None:
    """Warn (console and `warnings`) when `revision` is a branch or tag: its rows can change."""
    if revision and COMMIT.fullmatch(revision):
        return
    from rufus_data.console import console

    message = (f"{what}: revision {revision!r} of {repo} is a branch or tag, not a commit: {consequence}; pin a "
               f"commit sha{where} (https://huggingface.co/datasets/{repo}/commits/main)")
    console.print(f"[yellow]WARNING:[/] {message}", highlight=False)
    warnings.warn(message, stacklevel=3)


def hub_commit(repo: str, revision: str | None) -> str | None:
    """The commit a dataset revision (or the default branch) points at now; None when the hub
    cannot be asked (offline, gated: the load itself reports that)."""
    try:
        from huggingface_hub import HfApi

        return HfApi().dataset_info(repo, revision=revision, timeout=10).sha
    except Exception:  # noqa: BLE001 - any failure means "unknown", never a crash
        return None
