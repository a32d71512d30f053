"""The packages read as the data flow: rufus_data imports neither rufus_eval nor rufus_train, and
rufus_eval does not import rufus_train. Every import counts, in-function ones included.

Inside rufus_train the imports run down its floors too (parts, grpo, stages, one run, commands), and
in all three packages no module imports one that imports it back, round any number of modules: a
lazy import (or one for type checking only) is no way round either rule.

Benchmarks have one room, rufus_data/benchmarks/: the registry, the suite schema, the rows and
their conversion, BFCL's wheel rows and pulling are defined there and nowhere else; nothing outside
it reads the suite or registry YAML or loads rows for eval; it builds on the rewards (a suite's
scorers), never the reverse.

Inside rufus_data the floors show: the data steps are folders (mix/, decontam/, dedup/, rollouts/);
the services they share are floor folders in an order (base, similarity, folders, models, rewards,
generate, sources, benchmarks), each importing only itself and the floors below, none a data step;
a data step builds on another only where STEP_ON_STEP says why. The root holds only the map and
the commands. rufus_eval imports no data step, and rufus_train only where STEPS_ABOVE says why."""

from __future__ import annotations

import ast
import importlib.util
import re
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


BENCHMARKS = REPO / "rufus_data" / "benchmarks"
PACKAGES = ("rufus_data", "rufus_eval", "rufus_train")
# what only rufus_data/benchmarks/ may define
BENCHMARK_CONCEPTS = {
    "Registry", "BenchmarkSpec", "Haystack", "load_registry", "benchmark_spec",  # the registry
    "Suite", "Task", "load_suite", "suite_path", "find_suite",  # the suite schema
    "benchmark_rows", "task_source_rows", "row_ids", "convert_rows", "bfcl_rows",  # rows, conversion, BFCL
    "pull_suite", "resolve_against", "load_benchmarks", "EvalItem",  # pulling, decontam's view
}
# the benchmark package's readers behind benchmark_rows: used through it, never beside it
INNER_READERS = ("rufus_data.benchmarks.convert", "rufus_data.benchmarks.bfcl")
# path segments of the suite folder and the registry file
BENCHMARK_FILES = {"suites", "benchmarks.yaml"}


def outside_benchmarks() -> list[Path]:
    return [path for package in PACKAGES for path in sorted((REPO / package).rglob("*.py"))
            if BENCHMARKS not in path.parents]


def defined_names(path: Path) -> list[tuple[int, str]]:
    """(line, name) of every module-level class and function."""
    return [(node.lineno, node.name) for node in ast.parse(path.read_text(), str(path)).body
            if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))]


def imported_names(path: Path) -> list[tuple[int, str, str]]:
    """(line, module, name) of every `from module import name`."""
    return [(node.lineno, node.module, alias.name) for node in ast.walk(ast.parse(path.read_text(), str(path)))
            if isinstance(node, ast.ImportFrom) and node.module for alias in node.names]


def code_strings(path: Path) -> list[tuple[int, str]]:
    """(line, text) of every string constant that is not a docstring."""
    tree = ast.parse(path.read_text(), str(path))
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                  and node.body and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
    return [(node.lineno, node.value) for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings]


def benchmark_code_outside(paths: list[Path]) -> list[str]:
    """Where benchmark code lives outside its package: a concept defined again, a suite or registry
    file named, the inner readers imported, rows loaded by eval itself."""
    found = []
    for path in paths:
        where = path.relative_to(REPO) if REPO in path.parents else path
        found += [f"{where}:{line} defines {name}" for line, name in defined_names(path) if name in BENCHMARK_CONCEPTS]
        found += [f"{where}:{line} names {text!r}" for line, text in code_strings(path) if text in BENCHMARK_FILES]
        for line, module, name in imported_names(path):
            if module in INNER_READERS or f"{module}.{name}" in INNER_READERS:
                found.append(f"{where}:{line} imports {module}.{name}")
            if "rufus_eval" in path.parts and module == "rufus_data.sources.dataset_source" and name != "DatasetUnavailable":
                found.append(f"{where}:{line} loads rows itself ({name})")
    return found


def test_benchmark_code_lives_in_one_package():
    assert benchmark_code_outside(outside_benchmarks()) == []


def test_the_rewards_do_not_build_on_the_benchmarks():
    """A suite's scorers are reward specs: the benchmark package imports the rewards, not the reverse."""
    assert [f"{path.relative_to(REPO)}:{line} imports {module}"
            for path in sorted((REPO / "rufus_data" / "rewards").rglob("*.py"))
            for line, module in imported_modules(path) if module.startswith("rufus_data.benchmarks")] == []


def test_the_benchmark_check_sees_each_kind(tmp_path):
    module = tmp_path / "rufus_eval" / "m.py"
    module.parent.mkdir()
    module.write_text('''"""A module."""
from rufus_data.benchmarks.convert import convert_rows
from rufus_data.sources.dataset_source import DatasetUnavailable, load_rows

SUITES = CATALOGS / "suites"


def load_suite(name):
    """Reads benchmarks.yaml."""
''')
    assert benchmark_code_outside([module]) == [
        f"{module}:8 defines load_suite", f"{module}:5 names 'suites'",
        f"{module}:2 imports rufus_data.benchmarks.convert.convert_rows", f"{module}:3 loads rows itself (load_rows)"]


# ------------------------------------------------------------------ rufus_train's floors
# Lowest first; a module on none of them is on the ground floor, what the stages are built from
# (configs, models, data, checkpoints, TRL arguments, launching). A module imports nothing from a
# floor above its own.
TRAIN_FLOORS = (
    ("grpo", ("rufus_train.grpo",)),  # what the GRPO stages share; what a stage is sits below it (stage_base.py)
    ("stages", ("rufus_train.stages",)),
    ("one run", ("rufus_train.runner",)),
    ("commands", ("rufus_train.pipeline", "rufus_train.cli", "rufus_train.stage_help", "rufus_train.serve")),
)


def module_of(path: Path, root: Path) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def package_imports(path: Path, root: Path, packages: tuple[str, ...]) -> list[tuple[int, str]]:
    """(line, module) of every import of a module of `packages`; `from package import name` is the
    module `package.name` where that is a module."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            folder = root.joinpath(*node.module.split("."))
            names = [f"{node.module}.{alias.name}" if (folder / f"{alias.name}.py").exists()
                     or (folder / alias.name / "__init__.py").exists() else node.module for alias in node.names]
        found += [(node.lineno, name) for name in dict.fromkeys(names) if name.split(".")[0] in packages]
    return found


def floor_of(module: str) -> int:
    return next((i + 1 for i, (_, prefixes) in enumerate(TRAIN_FLOORS)
                 if any(module == p or module.startswith(p + ".") for p in prefixes)), 0)


def floor_name(floor: int) -> str:
    return TRAIN_FLOORS[floor - 1][0] if floor else "parts"


def train_modules(root: Path = REPO) -> list[Path]:
    return sorted((root / "rufus_train").rglob("*.py"))


def upward_imports(paths: list[Path], root: Path = REPO) -> list[str]:
    """Imports of a module on a higher floor than the importer's."""
    found = []
    for path in paths:
        own = floor_of(module_of(path, root))
        for line, module in package_imports(path, root, ("rufus_train",)):
            if floor_of(module) > own:
                found.append(f"{path.relative_to(root)}:{line} ({floor_name(own)}) imports {module} "
                             f"({floor_name(floor_of(module))})")
    return found


def package_modules(root: Path = REPO) -> list[Path]:
    return [path for package in PACKAGES for path in sorted((root / package).rglob("*.py"))]


def import_cycles(paths: list[Path], root: Path = REPO) -> list[list[str]]:
    """The modules that import each other round a cycle, each cycle once (sorted); imports across
    the packages count too."""
    graph = {module_of(p, root): {m for _, m in package_imports(p, root, PACKAGES)} for p in paths}
    cycles, seen = [], set()
    for start in sorted(graph):
        stack = [(start, [start])]
        while stack:
            node, trail = stack.pop()
            for nxt in sorted(graph.get(node, ())):
                if nxt == start:
                    cycle = sorted(trail)
                    if tuple(cycle) not in seen:
                        seen.add(tuple(cycle))
                        cycles.append(cycle)
                elif nxt not in trail and nxt > start:  # each cycle found from its smallest module
                    stack.append((nxt, trail + [nxt]))
    return cycles


def test_rufus_train_imports_run_down_its_floors():
    assert upward_imports(train_modules()) == []


def test_no_package_has_an_import_cycle():
    assert import_cycles(package_modules()) == []


def test_the_floor_checks_see_lazy_imports_and_cycles(tmp_path):
    package = tmp_path / "rufus_train"
    (package / "grpo").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "grpo" / "__init__.py").write_text("")
    (package / "runner.py").write_text("from rufus_train.grpo import setup\n")
    (package / "grpo" / "setup.py").write_text("def args():\n    from rufus_train.runner import trl_kwargs\n")
    (package / "grpo" / "stage.py").write_text("from rufus_train.stages import get_stage\n")
    (package / "checkpoints.py").write_text("def resume():\n    from rufus_train import mirror\n")
    (package / "mirror.py").write_text("from rufus_train.checkpoints import listing\n")
    paths = train_modules(tmp_path)
    assert upward_imports(paths, tmp_path) == [
        "rufus_train/grpo/setup.py:2 (grpo) imports rufus_train.runner (one run)",
        "rufus_train/grpo/stage.py:1 (grpo) imports rufus_train.stages (stages)"]
    assert import_cycles(paths, tmp_path) == [["rufus_train.checkpoints", "rufus_train.mirror"],
                                              ["rufus_train.grpo.setup", "rufus_train.runner"]]


def test_the_cycle_check_sees_every_package_and_type_checking_imports(tmp_path):
    for folder in ("rufus_data", "rufus_data/sources", "rufus_data/models", "rufus_eval"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "__init__.py").write_text("")
    (tmp_path / "rufus_data/sources/catalog.py").write_text("from rufus_data.sources.source_formats import DECLARED\n")
    (tmp_path / "rufus_data/sources/source_formats.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from rufus_data.sources.catalog import SourceSpec\n")
    (tmp_path / "rufus_data/models/builtin.py").write_text("from rufus_eval import staging\n")
    (tmp_path / "rufus_eval" / "staging.py").write_text("def f():\n    import rufus_data.models.builtin\n")
    assert import_cycles(package_modules(tmp_path), tmp_path) == [
        ["rufus_data.models.builtin", "rufus_eval.staging"],
        ["rufus_data.sources.catalog", "rufus_data.sources.source_formats"]]


DATA = REPO / "rufus_data"
# rufus_data's data steps, each a folder
DATA_STEPS = ("mix", "decontam", "dedup", "rollouts")
# the modules at rufus_data's root: the map and the commands, nothing shared
ROOT_MODULES = ("__init__.py", "cli.py", "shard_inspect.py")
# the one module that runs them all: the `rufus-data` command line
STEP_RUNNERS = ("rufus_data/cli.py",)
# (step, step it imports): why
STEP_ON_STEP = {("rollouts", "mix"): "filter and pairs mix a catalog given as input before reading its prompts"}
# rufus_data's floors, lowest first: a floor imports only itself and the floors below it, never a
# data step or the root's commands
DATA_FLOORS = ("base", "similarity", "folders", "models", "rewards", "generate", "sources", "benchmarks")
# what the packages above may take of rufus_data's steps: (package, step): why
STEPS_ABOVE = {("rufus_train", "mix"): "a stage's `data:` may name a catalog, mixed into shards before training",
               ("rufus_train", "rollouts"): "a GRPO stage's `filter:` runs rufus-data filter on its prompts first"}


def data_step(module: str) -> str | None:
    """The data step a dotted module name belongs to (None for a floor)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[0] == "rufus_data" and parts[1] in DATA_STEPS else None


def data_part(module: str) -> str | None:
    """The folder of rufus_data a dotted module belongs to; "root" for the root's modules."""
    parts = module.split(".")
    if parts[0] != "rufus_data":
        return None
    return parts[1] if len(parts) > 2 or (len(parts) == 2 and parts[1] in DATA_STEPS + DATA_FLOORS) else "root"


def data_modules(root: Path = REPO) -> list[Path]:
    return sorted((root / "rufus_data").rglob("*.py"))


def floor_violations(paths: list[Path], root: Path = REPO) -> list[str]:
    """Imports of a floor by a lower floor, or of a data step or root module by any floor."""
    found = []
    for path in paths:
        own = data_part(module_of(path, root))
        if own not in DATA_FLOORS:
            continue
        for line, module in package_imports(path, root, ("rufus_data",)):
            used = data_part(module)
            if used not in DATA_FLOORS or DATA_FLOORS.index(used) > DATA_FLOORS.index(own):
                found.append(f"{path.relative_to(root)}:{line} ({own}) imports {module} ({used})")
    return found


def step_imports(paths: list[Path], root: Path = REPO) -> list[str]:
    """Where these files import a data step (the files' own step not counted)."""
    found = []
    for path in paths:
        own = data_step(".".join(path.relative_to(root).with_suffix("").parts))
        for line, module in imported_modules(path):
            step = data_step(module)
            if step is not None and step != own:
                found.append(f"{path.relative_to(root)}:{line} imports {module}")
    return found


def test_the_floors_of_rufus_data_run_down():
    assert floor_violations(data_modules()) == []


def test_the_floor_order_check_sees_each_kind(tmp_path):
    files = {"rufus_data/__init__.py": "", "rufus_data/cli.py": "",
             "rufus_data/base/__init__.py": "", "rufus_data/base/console.py": "from rufus_data.models import hub\n",
             "rufus_data/models/__init__.py": "", "rufus_data/models/hub.py": "from rufus_data.base import console\n",
             "rufus_data/sources/__init__.py": "",
             "rufus_data/sources/catalog.py": "def f():\n    from rufus_data.mix import plan\n    import rufus_data.cli\n"}
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert floor_violations(data_modules(tmp_path), tmp_path) == [
        "rufus_data/base/console.py:1 (base) imports rufus_data.models.hub (models)",
        "rufus_data/sources/catalog.py:2 (sources) imports rufus_data.mix (mix)",
        "rufus_data/sources/catalog.py:3 (sources) imports rufus_data.cli (root)"]


def test_the_root_of_rufus_data_holds_only_the_map_and_the_commands():
    assert sorted(path.name for path in DATA.glob("*.py")) == sorted(ROOT_MODULES)


def test_every_floor_is_a_folder_with_a_map():
    assert [floor for floor in DATA_FLOORS if not docstring(DATA / floor / "__init__.py")] == []


def test_data_steps_build_on_each_other_only_where_documented():
    found = []
    for step in DATA_STEPS:
        for hit in step_imports(sorted((DATA / step).rglob("*.py"))):
            used = data_step(hit.rsplit(" imports ", 1)[1])
            if (step, used) not in STEP_ON_STEP:
                found.append(hit)
    assert found == []


def steps_used_above(paths: list[Path], root: Path = REPO) -> list[str]:
    """Imports of a data step from rufus_eval or rufus_train, beyond what STEPS_ABOVE allows."""
    found = []
    for path in paths:
        package = path.relative_to(root).parts[0]
        for hit in step_imports([path], root):
            if (package, data_step(hit.rsplit(" imports ", 1)[1])) not in STEPS_ABOVE:
                found.append(hit)
    return found


def test_eval_imports_no_data_step_and_train_only_mix():
    assert steps_used_above([p for package in ("rufus_eval", "rufus_train")
                             for p in sorted((REPO / package).rglob("*.py"))]) == []


def test_the_steps_above_check_sees_a_step_import(tmp_path):
    for name, text in {"rufus_eval/m.py": "from rufus_data.mix import mix_inputs\n",
                       "rufus_train/m.py": "from rufus_data.mix import mix_inputs\nimport rufus_data.dedup\n"}.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert steps_used_above(sorted(tmp_path.rglob("*.py")), tmp_path) == [
        "rufus_eval/m.py:1 imports rufus_data.mix", "rufus_train/m.py:2 imports rufus_data.dedup"]


def unclassified_folders(root: Path = DATA) -> list[str]:
    """rufus_data's folders of .py files that are neither a data step nor a floor (a folder
    inside one belongs to it)."""
    tops = {path.relative_to(root).parts[0] for path in root.rglob("*.py") if len(path.relative_to(root).parts) > 1}
    return sorted(tops - set(DATA_STEPS) - set(DATA_FLOORS))


def test_every_folder_of_rufus_data_is_a_step_or_a_floor():
    """A new folder is classified here first: the floor checks above cover only what is named."""
    assert unclassified_folders() == []


def test_the_folder_check_sees_a_new_folder(tmp_path):
    for name in ("cli.py", "mix/__init__.py", "generate/hf.py", "rewards/judges/llm.py", "cleanup/__init__.py",
                 "cleanup/inner/x.py", "notes/readme.txt"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("")
    assert unclassified_folders(tmp_path) == ["cleanup"]


def test_the_step_check_sees_a_step_import(tmp_path):
    module = tmp_path / "rufus_data" / "dedup" / "m.py"
    module.parent.mkdir(parents=True)
    module.write_text("import rufus_data.dedup.rows\n\n\ndef f():\n    from rufus_data.mix import mix\n")
    assert step_imports([module], root=tmp_path) == ["rufus_data/dedup/m.py:5 imports rufus_data.mix"]


# ------------------------------------------------------------------ the package maps
# Each package's docstring maps its modules; a sub-package's own docstring may map its modules
# (rufus_train/grpo/, rufus_eval/checkpoint_eval/, ...), and its parent's names the folder.


def docstring(path: Path) -> str:
    return (ast.get_docstring(ast.parse(path.read_text(), str(path))) or "") if path.exists() else ""


def unmapped_modules(package: str, root: Path = REPO) -> list[str]:
    """The modules (NAME.py) and sub-packages (NAME/) of `package` that no map above them names:
    the docstring of their package's __init__.py, or of any package's above it."""
    base = root / package
    found = []
    for path in sorted(base.rglob("*.py")):
        if path == base / "__init__.py":
            continue
        if path.name == "__init__.py":  # a sub-package: its folder is named by a map above it
            name, folder, label = f"{path.parent.name}/", path.parent.parent, f"{path.parent.relative_to(root)}/"
        else:
            name, folder, label = path.name, path.parent, str(path.relative_to(root))
        maps = [docstring(above / "__init__.py") for above in (folder, *folder.parents) if base in (above, *above.parents)]
        named = re.compile(r"(?<![\w.])" + re.escape(name) + ("" if name.endswith("/") else r"(?!\w)"))
        if not any(named.search(text) for text in maps):
            found.append(label)
    return found


@pytest.mark.parametrize("package", PACKAGES)
def test_the_package_map_names_every_module(package):
    assert unmapped_modules(package) == []


def test_the_map_check_sees_an_unnamed_module(tmp_path):
    base = tmp_path / "rufus_eval"
    files = {"__init__.py": '"""The map.\n\n- cli.py: the command.\n- checkpoint_eval/: its own docstring maps it."""\n',
             "cli.py": "", "request.py": '"""Names request.py itself, which is no map."""\n',
             "checkpoint_eval/__init__.py": '"""- callback.py: the events; rufus_curve.py is another."""\n',
             "checkpoint_eval/callback.py": "", "checkpoint_eval/curve.py": "",
             "extra/__init__.py": '"""- x.py: mapped here, but the folder is named nowhere."""\n', "extra/x.py": ""}
    for name, text in files.items():
        (base / name).parent.mkdir(parents=True, exist_ok=True)
        (base / name).write_text(text)
    assert unmapped_modules("rufus_eval", tmp_path) == [
        "rufus_eval/checkpoint_eval/curve.py", "rufus_eval/extra/", "rufus_eval/request.py"]


# ------------------------------------------------------------------ the move of the floors
def load_move_script():
    spec = importlib.util.spec_from_file_location("move_floors", REPO / "scripts" / "move_floors.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_no_file_names_a_floor_module_by_its_old_path():
    """The floors moved into folders (scripts/move_floors.py): no code, test, doc or catalog names
    an old path; the CHANGELOG, the script and this test name them on purpose."""
    move = load_move_script()
    exempt = {REPO / "CHANGELOG.md", REPO / "scripts" / "move_floors.py", Path(__file__).resolve()}
    assert [str(path.relative_to(REPO)) for path in move.tracked_text_files()
            if path not in exempt and path.exists() and move.rewrite(path.read_text()) != path.read_text()] == []


def test_the_old_path_check_sees_each_form():
    move = load_move_script()
    text = ("from rufus_data import models\nfrom rufus_data.console import console\n"
            'patch("rufus_data.openai_api._HOSTS")\nsee rufus_data/sources.py and rufus_data/templates/x.jinja\n')
    assert move.rewrite(text) == (
        "from rufus_data.models import builtin as models\nfrom rufus_data.base.console import console\n"
        'patch("rufus_data.models.openai_api._HOSTS")\nsee rufus_data/sources/canonical.py and '
        "rufus_data/models/templates/x.jinja\n")
    assert move.rewrite(move.rewrite(text)) == move.rewrite(text)
