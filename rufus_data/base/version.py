"""Which code made an output: the one Rufus version every manifest, run.json, results.json,
model card and `--version` records.

setuptools-scm versions the distribution from git: a tag is the release (`0.1.0`), a commit after
it `0.1.1.devN+gHASH`, and uncommitted changes add `.dYYYYMMDD` (its default local scheme). An
installed wheel carries the version it was built with. A source checkout asks setuptools-scm at
run time, since an editable install's metadata keeps the version of the day it was installed, not
the commit that runs now."""

from __future__ import annotations

import functools
import tomllib
from dataclasses import dataclass
from importlib import metadata

from packaging.version import InvalidVersion, Version

from rufus_data.base.catalog_files import source_checkout

DISTRIBUTION = "rufus"


@dataclass(frozen=True)
class CodeVersion:
    version: str  # the PEP 440 version, commit and dirty date included
    commit: str | None  # the abbreviated commit after a release tag; None for a release itself
    dirty: bool  # uncommitted changes in the checkout that ran

    @classmethod
    def of(cls, version: str) -> CodeVersion:
        """The commit and dirty flag of a version setuptools-scm wrote (its local part: `gHASH`, `dDATE`)."""
        try:
            local = (Version(version).local or "").split(".")
        except InvalidVersion:
            local = []
        commit = next((part[1:] for part in local if part.startswith("g")), None)
        dirty = any(part.startswith("d") and part[1:].isdigit() for part in local)
        return cls(version, commit, dirty)

    def describe(self) -> str:
        """`rufus 0.1.1.dev3+g1a2b3c4.d20261203 (commit 1a2b3c4, uncommitted changes)`."""
        notes = [f"commit {self.commit}"] if self.commit else []
        notes += ["uncommitted changes"] if self.dirty else []
        return f"{DISTRIBUTION} {self.version}" + (f" ({', '.join(notes)})" if notes else "")


def _installed_version() -> str:
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return "unknown"


def _checkout_version() -> str | None:
    """The version setuptools-scm gives the checkout now, with the checkout's own settings
    ([tool.setuptools_scm] of its pyproject.toml: the build's); None when setuptools-scm is not
    installed (it comes with the dev extra) or cannot tell (no git: the installed version stands)."""
    checkout = source_checkout()
    if checkout is None:
        return None
    try:
        import setuptools_scm
    except ImportError:
        return None
    settings = tomllib.loads((checkout / "pyproject.toml").read_text()).get("tool", {}).get("setuptools_scm", {})
    try:
        return setuptools_scm.get_version(root=str(checkout), **settings)
    except (LookupError, ValueError, OSError):  # no git, or tags it cannot read: not worth a crash
        return None


@functools.cache
def code_version() -> CodeVersion:
    return CodeVersion.of(_checkout_version() or _installed_version())


def rufus_version() -> str:
    return code_version().version
