"""Where catalogs are: the user's own first, then the ones Rufus ships.

The shipped catalogs are the repository's root `catalogs/` folder. The distribution installs it
as the package `rufus_catalogs` (pyproject.toml maps that package onto the folder: no second
copy), read here through importlib.resources. Run from a source checkout (a clone on PYTHONPATH,
or its editable install, which maps `rufus_catalogs` onto the same folder) they are that
checkout's `catalogs/`.

A catalog is looked up, in order:
1. as given, when that file exists (a path the user names, relative to the working folder);
2. `catalogs/REL` in the working folder: the user's own catalogs (`rufus-data catalogs copy`
   starts one from the shipped file);
3. the shipped `REL`.
A catalog found in none of them is an error naming the places it looked."""

from __future__ import annotations

import functools
import importlib.util
import shutil
from importlib import resources
from pathlib import Path

from rufus_data.base.errors import RufusError

SHIPPED_PACKAGE = "rufus_catalogs"
USER_FOLDER = "catalogs"  # the user's own catalogs, relative to the working folder
SHIPPED_SUFFIXES = (".yaml", ".jsonl", ".jinja", ".json")


@functools.cache
def source_checkout() -> Path | None:
    """The source checkout this code runs from (the folder above rufus_data, holding pyproject.toml
    and catalogs/); None when Rufus is installed from a wheel."""
    root = Path(__file__).resolve().parents[2]  # rufus_data/base/catalog_files.py
    return root if (root / "pyproject.toml").is_file() and (root / USER_FOLDER).is_dir() else None


@functools.cache
def shipped_root() -> Path:
    """The folder of the shipped catalogs: the checkout's catalogs/, else the installed package data."""
    checkout = source_checkout()
    if checkout is not None:
        return checkout / USER_FOLDER
    try:
        root = resources.files(SHIPPED_PACKAGE)
    except ModuleNotFoundError:
        raise RufusError(f"Rufus's shipped catalogs (the package {SHIPPED_PACKAGE}) are not installed: reinstall "
                         "rufus (`pip install --force-reinstall rufus`, or `pip install -e .` in a checkout)") from None
    if not isinstance(root, Path):  # a zipped install; pip always unpacks wheels
        raise RufusError(f"Rufus's shipped catalogs are inside an archive ({root}): install rufus with pip")
    return root


SHIPPED_DOCS = "rufus_docs"  # the repository's docs/ folder, and constraints.txt, in the wheel (setup.py)
CONSTRAINTS = "constraints.txt"


def constraints_file() -> Path:
    """The versions CI last tested (`pip install -c FILE`): the checkout's constraints.txt, else the
    copy the wheel ships (setup.py puts it into the package rufus_docs)."""
    checkout = source_checkout()
    if checkout is not None:
        return checkout / CONSTRAINTS
    try:
        shipped = resources.files(SHIPPED_DOCS) / CONSTRAINTS
    except ModuleNotFoundError:
        shipped = None
    if not isinstance(shipped, Path) or not shipped.is_file():
        raise RufusError(f"this install of Rufus ships no {CONSTRAINTS}: reinstall it from a wheel built by pip "
                         "(`pip wheel --no-deps .` in a checkout)")
    return shipped


@functools.cache
def docs_root() -> Path:
    """The docs/ pages messages and help cite: the checkout's docs/, else the copy in the wheel."""
    checkout = source_checkout()
    if checkout is not None:
        return checkout / "docs"
    spec = importlib.util.find_spec(SHIPPED_DOCS)
    if spec is None or not spec.submodule_search_locations:
        raise RufusError(f"Rufus's docs (the package {SHIPPED_DOCS}) are not installed: reinstall rufus")
    return Path(next(iter(spec.submodule_search_locations)))  # a folder without __init__.py has no files() path


def docs_page(page: str) -> str:
    """A docs page as the user can open it: `docs/PAGE` from a checkout's root (relative to the
    working folder when under it), else the absolute path of the installed copy."""
    path = docs_root() / page
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def user_root() -> Path:
    return Path(USER_FOLDER)


def _relative(entry: str | Path) -> Path | None:
    """`REL` of an entry written `catalogs/REL` (a relative path inside a catalogs folder); None otherwise."""
    path = Path(entry)
    if path.is_absolute() or not path.parts or path.parts[0] != USER_FOLDER or len(path.parts) < 2:
        return None
    return Path(*path.parts[1:])


def find_catalog_file(relative: str | Path) -> Path | None:
    """`REL` (e.g. `stages/sft.yaml`) among the user's own catalogs, else the shipped ones; None when
    neither has it."""
    for root in (user_root(), shipped_root()):
        if (root / relative).is_file():
            return root / relative
    return None


def looked_in(relative: str | Path) -> str:
    """Where find_catalog_file looked for `REL`, for an error message."""
    return (f"looked in your catalogs ({(user_root() / relative).resolve()}) and in the shipped ones "
            f"({shipped_root() / relative}); `rufus-data catalogs list` lists the shipped catalogs")


def catalog_file(relative: str | Path, what: str = "catalog") -> Path:
    """`REL` as find_catalog_file finds it; a RufusError naming both places when neither has it."""
    found = find_catalog_file(relative)
    if found is None:
        raise RufusError(f"no {what} {relative}: {looked_in(relative)}")
    return found


def resolve_entry(entry: str | Path) -> Path:
    """A catalog path as written on a command line or in a YAML (`catalogs/rl.yaml`, a stage's
    `catalogs/data/...`, `my.yaml`): as given when that exists; else, for `catalogs/REL`, the
    shipped REL. A missing `catalogs/REL` is an error naming both places; any other path that does
    not exist is returned as given, for the reader to report."""
    path = Path(entry).expanduser()
    relative = _relative(path)
    if path.exists() or relative is None:
        return path
    found = find_catalog_file(relative)
    if found is None:
        raise RufusError(f"{entry} does not exist: {looked_in(relative)}")
    return found


def is_shipped(path: str | Path) -> bool:
    """A file of the shipped catalogs (a stage's default data), not the user's own."""
    return Path(path).resolve().is_relative_to(shipped_root().resolve())


def catalog_names(folder: str) -> list[str]:
    """The YAML stems of `folder` (`suites`, `stages`) in the user's catalogs and the shipped ones."""
    return sorted({p.stem for root in (user_root(), shipped_root()) for p in (root / folder).glob("*.yaml")})


def shipped_catalogs() -> list[str]:
    """Every shipped catalog file, as its path inside the catalogs folder (`stages/sft.yaml`)."""
    root = shipped_root()
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*")
                  if p.is_file() and p.suffix in SHIPPED_SUFFIXES)


def copy_shipped(relative: str, dest: str | Path | None = None, overwrite: bool = False) -> Path:
    """Copy a shipped catalog to `dest` (default: the same path among the user's catalogs, which
    then wins over the shipped one) to edit it. An existing file is kept unless `overwrite`."""
    relative = str(_relative(relative) or relative)
    source = shipped_root() / relative
    if not source.is_file():
        raise RufusError(f"no shipped catalog {relative}: `rufus-data catalogs list` lists them")
    target = Path(dest) if dest is not None else user_root() / relative
    if target.is_dir():
        target = target / source.name
    if target.exists() and not overwrite:
        raise RufusError(f"{target} exists: pass --overwrite to replace it, or give another destination")
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.tmp")
    shutil.copyfile(source, tmp)
    tmp.replace(target)
    return target
