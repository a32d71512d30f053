"""Where a run resumes from: the checkpoint named, or with `latest` the newest complete one of
output_dir (checkpoints.py), else the mirror's newest, copied into output_dir (mirror.py), else
a fresh run. Above both: the mirror is built on the checkpoints' completeness rules. The
checkpoint chosen is checked file by file against its recorded sha256 before anything resumes
(a restored one already was, by mirror.restore)."""

from __future__ import annotations

import shutil
from pathlib import Path

from rufus_data.base.console import console
from rufus_data.base.errors import RufusError
from rufus_train.checkpoints import (
    LATEST,
    checkpoint_problem,
    checkpoint_steps,
    local_storage,
    markers_expected,
    newest_complete,
    verify_checksums,
)
from rufus_train.mirror import restore


def resume_checkpoint(resume: str | None, out: Path, mirror: str | None) -> str | None:
    """The checkpoint a run resumes from: the one named, the newest complete one (`latest`), or
    None (a fresh run, said so when `latest` found nothing)."""
    if not resume:
        return None
    local = local_storage()
    if resume != LATEST:
        folder = Path(resume).resolve()
        expected = markers_expected(local, checkpoint_steps(local, str(folder.parent)))
        problem = checkpoint_problem(local, str(folder), expected)
        if problem:
            raise RufusError(f"resume_from_checkpoint {resume}: {problem}. Give a complete checkpoint, or `latest`")
        verify_checksums(folder)
        return resume
    found, skipped = newest_complete(local, str(out.resolve()), str(out))
    for path in skipped:  # written again by the resumed run (a half-written folder would mix with it)
        shutil.rmtree(path, ignore_errors=True)
    if found is not None:
        verify_checksums(Path(found))
    elif mirror:
        found = restore(mirror, out)  # checked before it is renamed into place
    if found is None:
        places = f"{out} or the mirror {mirror}" if mirror else str(out)
        console.print(f"resume: latest: no complete checkpoint in {places}: starting a fresh run",
                      highlight=False, soft_wrap=True)
        return None
    console.print(f"resume: latest: continuing from {found}", highlight=False, soft_wrap=True)
    return found
