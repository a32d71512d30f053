"""Pushing a folder to the Hub: one private repo (by default) per push, created when missing,
the folder uploaded in one commit through huggingface_hub, the token from its usual places
(HF_TOKEN, `hf auth login`), the endpoint from HF_ENDPOINT. `rufus-data push` sends data
folders; a stage's `push_to_hub:` sends its run folder after Rufus's model card is written."""

from __future__ import annotations

from pathlib import Path

from rufus_data.base.console import console
from rufus_data.base.errors import RufusError

DATA_FOLDER_FILES = ("README.md", "manifest.json")


def check_repo_id(repo_id: str, what: str) -> str:
    """ORG/NAME as the Hub spells it; refused before any work with what to write instead."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(repo_id)
    except HFValidationError as err:
        raise RufusError(f"{what} {repo_id!r} is not a Hub repo id ({err}): write ORG/NAME, e.g. my-org/sft-mix") from None
    if "/" not in repo_id:
        raise RufusError(f"{what} {repo_id!r} names no owner: write ORG/NAME (your user name or an organisation)")
    return repo_id


def push_folder(folder: str | Path, repo_id: str, repo_type: str, *, private: bool = True,
                ignore: list[str] | None = None, message: str | None = None) -> str:
    """Create `repo_id` (private unless told otherwise; an existing repo keeps its visibility) and
    upload `folder` into it in one commit; returns the commit's URL."""
    from huggingface_hub import HfApi
    from huggingface_hub.errors import HfHubHTTPError

    folder = Path(folder)
    api = HfApi()
    try:
        url = api.create_repo(repo_id, repo_type=repo_type, private=private, exist_ok=True)
        commit = api.upload_folder(folder_path=folder, repo_id=repo_id, repo_type=repo_type, ignore_patterns=ignore,
                                   commit_message=message or f"Upload {folder.name} with Rufus")
    except HfHubHTTPError as err:
        status = err.response.status_code if err.response is not None else "?"
        hint = (" (log in with `hf auth login` or set HF_TOKEN to a token that can write to it)"
                if status in (401, 403) else "")
        raise RufusError(f"pushing {folder} to {api.endpoint}/{repo_id} failed: HTTP {status}{hint}: "
                         f"{str(err).splitlines()[0]}") from None
    console.print(f"pushed {folder} to {url} ({'private' if private else 'public'}): {commit.commit_url}",
                  highlight=False, soft_wrap=True)
    return commit.commit_url


def push_data_folder(folder: str | Path, repo_id: str, private: bool = True) -> str:
    """A rufus-data output folder (its dataset card and manifest there) as a dataset repo."""
    folder = Path(folder)
    check_repo_id(repo_id, "the dataset repo")
    missing = [name for name in DATA_FOLDER_FILES if not (folder / name).is_file()]
    if missing:
        raise RufusError(f"{folder} has no {' or '.join(missing)}: push the output folder of a rufus-data step "
                         "(mix, decontam, dedup, filter, pairs), which writes its dataset card and manifest")
    return push_folder(folder, repo_id, "dataset", private=private, ignore=[".*", "**/.*"])
