"""A data step's package names its entry points without importing them: `rufus-data` builds its
command-line options from each step's config module when it starts, and importing
`rufus_data.mix.config` runs `rufus_data/mix/__init__.py` first, which must then load no arrow,
numpy or tokenizer (PEP 562: the name is imported from its module on first use)."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any


def lazy_exports(package: str, exports: dict[str, str]) -> Callable[[str], Any]:
    """A module `__getattr__` for `package`: each name of `exports` is read from its submodule
    (`{"mix": "run"}`: `package.mix` is `package.run.mix`) when first asked for."""

    def __getattr__(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(f"{package}.{module}"), name)

    return __getattr__
