"""Hub revisions: a number is reproducible only when the data it came from is pinned to a commit."""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import re
import socket
import sys
import warnings
from collections.abc import Iterator
from urllib.parse import urlparse

from rufus_data.base.console import console
from rufus_data.base.errors import UnpinnedRevision
from rufus_data.folders.run_folder import MODEL_CONFIG

log = logging.getLogger("rufus_data")
COMMIT = re.compile(r"[0-9a-f]{40}")
OFFLINE_VALUES = ("1", "true", "yes", "on")
PROBE_TIMEOUT_S = 3.0


def warn_if_unpinned(what: str, repo: str, revision: str | None, consequence: str, where: str = "",
                     shipped: bool = False) -> None:
    """Warn (console and `warnings`) when `revision` is a branch or tag: its rows can change. A
    revision a shipped catalog holds is the maintainers' to pin, not the user's: it goes to the
    log (logger rufus_data: a stage's train.log), not the screen."""
    if revision and COMMIT.fullmatch(revision):
        return
    state = f"revision {revision!r} of {repo} is a branch or tag, not a commit" if revision else f"{repo} has no revision"
    message = (f"{what}: {state}: {consequence}; pin a commit sha{where} "
               f"(https://huggingface.co/datasets/{repo}/commits/main)")
    if shipped:
        log.info("%s (a shipped catalog: for Rufus's maintainers)", message)
        return
    console.print(f"[yellow]WARNING:[/] {message}", highlight=False, soft_wrap=True)
    warnings.warn(message, UnpinnedRevision, stacklevel=3)


def hub_commit(repo: str, revision: str | None) -> str | None:
    """The commit a dataset revision (or the default branch) points at now; None when the hub
    cannot be asked (offline, gated: the load itself reports that)."""
    try:
        from huggingface_hub import HfApi

        return HfApi().dataset_info(repo, revision=revision, timeout=10).sha
    except Exception:  # noqa: BLE001 - any failure means "unknown", never a crash
        return None


def offline_variable() -> str | None:
    """The variable that puts this process offline, read as the libraries read it: HF_HUB_OFFLINE, else
    TRANSFORMERS_OFFLINE (huggingface_hub takes the first one set), or HF_DATASETS_OFFLINE (datasets)."""
    hub = "HF_HUB_OFFLINE" if os.environ.get("HF_HUB_OFFLINE") else "TRANSFORMERS_OFFLINE"
    return next((v for v in (hub, "HF_DATASETS_OFFLINE") if os.environ.get(v, "").lower() in OFFLINE_VALUES), None)


def offline_mode() -> bool:
    """Offline (`offline_variable`, or `datasets`, once imported, told so): the caches are used, the
    network never."""
    datasets = sys.modules.get("datasets")
    if datasets is not None and getattr(getattr(datasets, "config", None), "HF_HUB_OFFLINE", False):
        return True
    return offline_variable() is not None


@contextlib.contextmanager
def offline_honoured(datasets_module) -> Iterator[None]:
    """`datasets` and `huggingface_hub` read HF_HUB_OFFLINE once, at import: set later (a notebook,
    a test), it must still mean "the cache only", not ~25 s of retries per dataset against a dead
    network. Their flags follow `offline_mode()` for the duration, then return to what they were."""
    from huggingface_hub import constants  # loaded with `datasets`, which the caller holds

    before = datasets_module.config.HF_HUB_OFFLINE, constants.HF_HUB_OFFLINE
    if offline_mode():
        datasets_module.config.HF_HUB_OFFLINE = constants.HF_HUB_OFFLINE = True
    try:
        yield
    finally:
        datasets_module.config.HF_HUB_OFFLINE, constants.HF_HUB_OFFLINE = before


@functools.cache
def hub_unreachable() -> str | None:
    """Why the hub cannot be reached from here (None: it answers). Asked once per process with a
    short TCP connect, because `datasets` retries a dead network for about 25 s per dataset."""
    if any(os.environ.get(v) or os.environ.get(v.lower()) for v in ("HTTPS_PROXY", "HTTP_PROXY", "ALL_PROXY")):
        return None  # behind a proxy a direct connect proves nothing: let the hub client try
    endpoint = os.environ.get("HF_ENDPOINT") or "https://huggingface.co"
    url = urlparse(endpoint)
    host, port = url.hostname or endpoint, url.port or (443 if url.scheme != "http" else 80)
    try:
        socket.create_connection((host, port), timeout=PROBE_TIMEOUT_S).close()
    except OSError as err:
        return f"{host}:{port} cannot be reached ({err.strerror or type(err).__name__})"
    return None


def model_unavailable(repo: str) -> str | None:
    """Why the hub model `repo` cannot be loaded from here (None: it is in the local Hugging Face
    cache, or the hub answers). Asked before a command loads anything, because transformers
    retries a dead network for about a minute and then raises a traceback."""
    from huggingface_hub import try_to_load_from_cache  # only when a hub id is given

    try:
        cached = try_to_load_from_cache(repo, MODEL_CONFIG)
    except Exception as err:  # noqa: BLE001 - an id the hub client refuses (bad characters, too many /)
        return f"it is not a valid hub id ({type(err).__name__}: {err})"
    if isinstance(cached, str):
        return None
    if offline_mode():
        return f"{offline_variable() or 'HF_HUB_OFFLINE'} is set and it is not in the Hugging Face cache"
    unreachable = hub_unreachable()
    return f"it is not in the Hugging Face cache and {unreachable}" if unreachable else None
