"""Move rufus_data's loose floor modules into named folders, and rewrite every import of them.

Run once on main (the commit is listed in .git-blame-ignore-revs): `python scripts/move_floors.py
--apply`. A branch begun before the move rebases across it with `python scripts/move_floors.py
--rewrite FILE...` (or no FILE: every text file git tracks), which rewrites the old module paths
in its own files without moving anything.

What it rewrites: dotted module paths (`rufus_data.models` -> `rufus_data.models.builtin`, also in
strings such as monkeypatch targets), `from rufus_data import NAME` of a moved module, and file
paths (`rufus_data/models.py`, `rufus_data/templates/`) in code and docs."""

from __future__ import annotations

import argparse
import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# folder -> {old module name: new module name}, lowest floor first
FLOORS = {
    "base": {name: name for name in (
        "errors", "console", "cli_options", "yaml_config", "paths", "cache", "version", "catalog_files",
        "env_report", "engines", "report", "jsonl", "cpu_threads", "lazy_exports")},
    "folders": {name: name for name in (
        "shards", "run_folder", "output_lock", "output_step", "lineage", "dataset_card", "hub_push",
        "review_page")},
    "models": {"models": "builtin", "merged_model": "merged_model", "hub": "hub", "openai_api": "openai_api",
               "devices": "devices"},
    "sources": {"catalog": "catalog", "dataset_source": "dataset_source", "source_formats": "source_formats",
                "sources": "canonical", "builders": "builders", "tokens": "tokens", "chat_render": "chat_render",
                "perturb": "perturb", "inputs": "inputs"},
}
# folders of non-Python files that move with their readers
MOVED_FOLDERS = {"templates": "models/templates"}
MOVES = {old: (folder, new) for folder, modules in FLOORS.items() for old, new in modules.items()}

_names = "|".join(sorted(MOVES, key=len, reverse=True))
DOTTED = re.compile(rf"\brufus_data\.({_names})\b")
# an old name that is now a folder (`models`, `sources`): `rufus_data.models.hub` or `from
# rufus_data.models import hub` is already a new path, so rewriting twice is a no-op; so is a
# module added to the folder since the move (`rufus_data.models.reference`)
ALREADY_NEW = {folder: re.compile(r"(?:\.| import )(?:{})\b".format("|".join(
    [*modules.values(), "templates", *(path.stem for path in (REPO / "rufus_data" / folder).glob("*.py"))])))
               for folder, modules in FLOORS.items() if folder in MOVES}
FROM_ROOT = re.compile(rf"^(\s*)from rufus_data import ({_names})(?: as (\w+))?\s*$", re.MULTILINE)
PATH = re.compile(rf"\brufus_data/({_names})\.py\b")
FOLDER_PATH = re.compile(r"\brufus_data/(" + "|".join(MOVED_FOLDERS) + r")/")


def _dotted(match: re.Match) -> str:
    old = match.group(1)
    if old in ALREADY_NEW and ALREADY_NEW[old].match(match.string, match.end()):
        return match.group(0)
    return "rufus_data.{}.{}".format(*MOVES[old])


def _from_root(match: re.Match) -> str:
    indent, old, alias = match.groups()
    folder, new = MOVES[old]
    local = alias or old
    return f"{indent}from rufus_data.{folder} import {new}" + ("" if new == local else f" as {local}")


def rewrite(text: str) -> str:
    """The text with every old module path of rufus_data's floors replaced by the new one."""
    text = DOTTED.sub(_dotted, text)
    text = FROM_ROOT.sub(_from_root, text)
    text = PATH.sub(lambda m: "rufus_data/{}/{}.py".format(*MOVES[m.group(1)]), text)
    return FOLDER_PATH.sub(lambda m: f"rufus_data/{MOVED_FOLDERS[m.group(1)]}/", text)


def tracked_text_files() -> list[Path]:
    names = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout.split()
    return [REPO / name for name in names if Path(name).suffix in {".py", ".md", ".yaml", ".toml", ".sh", ".cfg", ".txt"}
            or Path(name).name in {"Makefile"}]


def rewrite_files(paths: list[Path]) -> int:
    changed = 0
    for path in paths:
        if path.resolve() == Path(__file__).resolve():
            continue
        text = path.read_text()
        new = rewrite(text)
        if new != text:
            path.write_text(new)
            changed += 1
    return changed


def git_mv(source: Path, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(["git", "mv", str(source), str(target)], cwd=REPO, check=True)


def apply() -> None:
    data = REPO / "rufus_data"
    for old, (folder, new) in MOVES.items():
        git_mv(data / f"{old}.py", data / folder / f"{new}.py")
    for old, new in MOVED_FOLDERS.items():
        git_mv(data / old, data / new)
    for folder in FLOORS:
        init = data / folder / "__init__.py"
        if not init.exists():
            init.write_text(f'"""{folder}/: (map written by hand after the move)"""\n')
            subprocess.run(["git", "add", str(init)], cwd=REPO, check=True)
    print(f"rewrote {rewrite_files(tracked_text_files())} files")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--apply", action="store_true", help="move the modules and rewrite every tracked file")
    group.add_argument("--rewrite", nargs="*", type=Path, metavar="FILE",
                       help="rewrite old module paths in these files (none: every tracked text file)")
    args = parser.parse_args()
    if args.apply:
        apply()
    else:
        print(f"rewrote {rewrite_files(args.rewrite or tracked_text_files())} files")


if __name__ == "__main__":
    main()
