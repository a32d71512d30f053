"""The packages read as the data flow: rufus_data imports neither rufus_eval nor rufus_train, and
rufus_eval does not import rufus_train. Every import counts, in-function ones included."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
FORBIDDEN = {"rufus_data": ("rufus_eval", "rufus_train"), "rufus_eval": ("rufus_train",)}


def imported_modules(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every import statement in a file."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.lineno, node.module))
    return found


def layering_violations(package: str) -> list[str]:
    below = FORBIDDEN[package]
    return [f"{path.relative_to(REPO)}:{line} imports {module}"
            for path in sorted((REPO / package).rglob("*.py"))
            for line, module in imported_modules(path)
            if module.split(".")[0] in below]


@pytest.mark.parametrize("package", list(FORBIDDEN))
def test_lower_layers_do_not_import_higher_ones(package):
    assert layering_violations(package) == []


def test_the_check_sees_in_function_imports(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from rufus_train import runner\n    import rufus_eval.suite\n")
    assert imported_modules(module) == [(2, "rufus_train"), (3, "rufus_eval.suite")]
