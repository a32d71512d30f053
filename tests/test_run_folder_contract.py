"""The run folder's contract (rufus_data/folders/run_folder.py): which run a model reference belongs to,
checkpoint names, run.json written whole, the lineage a run in training already has, and the
names of a run folder's and a checkpoint's files spelled in that one module only."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest
from test_layering import REPO

from rufus_data.base.errors import RufusError
from rufus_data.folders import run_folder
from rufus_data.folders.run_folder import (
    checkpoint_dir,
    checkpoint_step_of,
    eval_step_dir,
    eval_step_dirs,
    eval_step_of,
    read_lineage,
    read_run_json,
    run_of,
    run_step,
    write_lineage,
    write_run_json,
)

CONTRACT = REPO / "rufus_data" / "folders" / "run_folder.py"
# names of the contract that are ordinary words elsewhere too, so a literal of them proves nothing:
# a JSON key (run.json's `data`, trainer state's `global_step`), a config value
# (`resume_from_checkpoint: latest`), a word (`optimizer`), a shard folder's card (README.md)
ORDINARY_WORDS = {"data", "global_step", "latest", "optimizer", "README.md"}


def layout_names(contract: Path = CONTRACT) -> set[str]:
    """Every name the contract spells: its module-level string constants, and those in its tuples."""
    found = set()
    for node in ast.parse(contract.read_text()).body:
        if isinstance(node, ast.Assign):
            values = node.value.elts if isinstance(node.value, ast.Tuple) else [node.value]
            found |= {v.value for v in values if isinstance(v, ast.Constant) and isinstance(v.value, str)}
    return found - ORDINARY_WORDS


def code_texts(path: Path) -> list[tuple[int, str]]:
    """(line, text) of every string in the code that is not a docstring; an f-string is one text,
    `{}` where its values go."""
    tree = ast.parse(path.read_text(), str(path))
    skip = {id(node.body[0].value) for node in ast.walk(tree)
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
            and node.body and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            skip |= {id(part) for part in node.values}
            found.append((node.lineno, "".join(part.value if isinstance(part, ast.Constant) else "{}"
                                               for part in node.values)))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
            found.append((node.lineno, node.value))
    return found


def spelled_names(path: Path, names: set[str]) -> list[tuple[int, str]]:
    """Where code spells a layout name: a path-like text (no space: messages may name the files)
    with a part that is one of `names`, or a prefix of them (checkpoint-, step-) followed by a
    number, a glob, a value or a regex group."""
    prefixes = [name for name in names if name.endswith(("-", "_"))]
    numbered = re.compile("(" + "|".join(map(re.escape, prefixes)) + r")(\d+|\*|\{\}|\(.*)?") if prefixes else None
    return [(line, text) for line, text in code_texts(path) if not re.search(r"\s", text)
            and any(part in names or (numbered and numbered.fullmatch(part)) for part in text.split("/"))]


def test_a_model_reference_finds_its_run(tmp_path):
    run = tmp_path / "runs" / "sft"
    for folder in (checkpoint_dir(run, 3), run / run_folder.STAGING / "checkpoint-4", run / run_folder.MERGED_DIR):
        folder.mkdir(parents=True)
    assert run_of(run) is None  # nothing says it is a run yet
    write_lineage(run, {"version": 1, "data": [], "base": {"model": "smollm2-135m", "run": None}})
    for reference in (run, checkpoint_dir(run, 3), run / run_folder.STAGING / "checkpoint-4", run / run_folder.MERGED_DIR):
        assert run_of(str(reference)) == run.resolve()
    assert run_of("smollm2-135m") is None and run_of(tmp_path) is None
    assert checkpoint_step_of(checkpoint_dir(run, 12)) == 12 and checkpoint_step_of(f"{checkpoint_dir(run, 5)}/") == 5
    assert checkpoint_step_of("mycheckpoint-12") is None and checkpoint_step_of(run) is None


def test_run_json_is_written_whole_and_carries_the_lineage(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    lineage = {"version": 1, "data": [{"name": "a"}], "base": {"model": "m", "run": None}}
    write_lineage(run, lineage)
    assert read_lineage(run) == lineage and read_run_json(run) == {} and run_step(run) is None  # still training
    write_run_json(run, {"global_step": 2, "lineage": {**lineage, "data": []}})
    assert sorted(p.name for p in run.iterdir()) == ["lineage.json", "run.json"]  # no temporary file left
    assert read_lineage(run)["data"] == [] and run_step(run) == 2  # the finished run's own record
    (run / run_folder.RUN_JSON).write_text("{")
    with pytest.raises(RufusError, match="run.json is not valid JSON.*give --step N"):
        run_step(run)
    (run / run_folder.RUN_JSON).write_text(json.dumps({"global_step": "two"}))
    with pytest.raises(RufusError, match="no integer global_step"):
        run_step(run)


def test_eval_step_folders_are_numbered(tmp_path):
    run = tmp_path / "run"
    for step in (10, 2, 0):
        eval_step_dir(run, step).mkdir(parents=True)
    (run / run_folder.EVAL_LOGS / "step-x").mkdir()
    assert [step for step, _ in eval_step_dirs(run)] == [0, 2, 10]  # by number, not by name
    assert eval_step_of(eval_step_dir(run, 7)) == 7 and eval_step_of(run) is None


def test_the_run_folder_names_are_spelled_in_one_module():
    names = layout_names()
    assert {"run.json", "checkpoint-", "adapter_config.json", "model.safetensors", "rufus_complete.json"} <= names
    found = [f"{path.relative_to(REPO)}:{line} spells {text!r}"
             for package in ("rufus_data", "rufus_eval", "rufus_train", "bench", "scripts")
             for path in sorted((REPO / package).rglob("*.py")) if path != CONTRACT
             for line, text in spelled_names(path, names)]
    assert found == []


def test_the_names_check_sees_each_spelling(tmp_path):
    contract = tmp_path / "contract.py"
    contract.write_text('RUN_JSON = "run.json"\nSTEP = "step-"\nCHECKPOINT = "checkpoint-"\n'
                        'WEIGHTS = ("model.safetensors", "adapter_model.bin")\nDATA = "data"\n')
    names = layout_names(contract)
    assert names == {"run.json", "step-", "checkpoint-", "model.safetensors", "adapter_model.bin"}
    module = tmp_path / "m.py"
    module.write_text('''"""Reads run.json."""
import re
RUN = "run.json"
PATTERN = re.compile(r"checkpoint-(\\d+)")
IGNORE = ["checkpoint-*", "x/model.safetensors"]


def f(out, step, merged):
    """Reads checkpoint-N/adapter_model.bin."""
    print(f"run.json of {out} is missing")
    return out / f"step-{step}", f"{out}/adapter_model.bin", "checkpoint-mirror", "data"
''')
    assert sorted(spelled_names(module, names)) == [
        (3, "run.json"), (4, r"checkpoint-(\d+)"), (5, "checkpoint-*"), (5, "x/model.safetensors"),
        (11, "step-{}"), (11, "{}/adapter_model.bin")]
