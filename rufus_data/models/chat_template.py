"""Which chat template a tokenizer renders with, and what to call it.

`chat_template:` (a mix catalog, a stage config) names one: a shipped name (Rufus's own
`rufus_chatml`, or an original template as the installed TRL stores it, such as `qwen2_5` or
`llama3_1`: TRL's `chat_templates/` folder, read without importing TRL), a `.jinja` file, or the
jinja text itself (catalogs). A base model ships none, so its stage must name one. Messages and
records name a template by its shipped name when it is one, byte for byte, else by its sha256."""

from __future__ import annotations

import hashlib
import importlib.util
from functools import lru_cache
from pathlib import Path

from rufus_data.base.errors import RufusError

RUFUS_TEMPLATES = Path(__file__).parent / "templates"


def trl_templates_folder() -> Path | None:
    """The installed TRL's chat_templates/ folder (None: TRL is not installed)."""
    spec = importlib.util.find_spec("trl")
    if spec is None or not spec.submodule_search_locations:
        return None
    folder = Path(next(iter(spec.submodule_search_locations))) / "chat_templates"
    return folder if folder.is_dir() else None


@lru_cache(maxsize=1)
def shipped_templates() -> dict[str, str]:
    """{name: template text}: Rufus's templates, then TRL's original (not `_training`) ones."""
    found = {path.stem: path.read_text(encoding="utf-8") for path in sorted(RUFUS_TEMPLATES.glob("*.jinja"))}
    trl_folder = trl_templates_folder()
    for path in sorted(trl_folder.glob("*.jinja")) if trl_folder else ():
        if not path.stem.endswith("_training"):
            found.setdefault(path.stem, path.read_text(encoding="utf-8"))
    return found


def template_sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def template_name(text: str) -> str:
    """The shipped name of a template (byte for byte), else `custom (sha256 <first 12>)`."""
    for name, shipped in shipped_templates().items():
        if shipped == text:
            return name
    return f"custom (sha256 {template_sha256(text)[:12]})"


def read_chat_template(value: str, folder: Path, where: str) -> str:
    """The text `chat_template: value` names: inline jinja, a shipped name, or a file (relative to
    `folder`). `where`: the file or setting named in the error."""
    if "{%" in value or "{{" in value:
        return value
    shipped = shipped_templates()
    if value in shipped:
        return shipped[value]
    path = Path(value).expanduser()
    path = path if path.is_absolute() else folder / path
    if path.is_file():
        return path.read_text(encoding="utf-8")
    names = ", ".join(sorted(shipped))
    raise RufusError(f"{where}: chat_template {value!r} is neither a shipped template nor a file ({path} does not "
                     f"exist): give a .jinja file or one of {names}")


def record(text: str, source: str) -> dict:
    """What a manifest or run.json records of a template: its name, sha256, and where it came from
    (`model`: the tokenizer's own; else the `chat_template:` setting as given)."""
    return {"name": template_name(text), "sha256": template_sha256(text), "source": source}
