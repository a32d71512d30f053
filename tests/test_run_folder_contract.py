"""The run folder's contract (rufus_data/run_folder.py): which run a model reference belongs to,
checkpoint names, run.json written whole, the lineage a run in training already has, and the
file names spelled in that one module only."""

from __future__ import annotations

import json

import pytest
from test_layering import REPO, code_strings

from rufus_data import run_folder
from rufus_data.errors import RufusError
from rufus_data.run_folder import (
    checkpoint_dir,
    checkpoint_step_of,
    read_lineage,
    read_run_json,
    run_of,
    run_step,
    write_lineage,
    write_run_json,
)

NAMES = {run_folder.CONFIG_YAML, run_folder.TRAIN_LOG, run_folder.METRICS, run_folder.LINEAGE_JSON,
         run_folder.RUN_JSON, run_folder.MERGED_DIR, run_folder.STAGING, run_folder.EVAL_LOGS}


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


def test_the_run_folder_names_are_spelled_in_one_module():
    contract = REPO / "rufus_data" / "run_folder.py"
    found = [f"{path.relative_to(REPO)}:{line} names {text!r}"
             for package in ("rufus_data", "rufus_eval", "rufus_train", "bench", "scripts")
             for path in sorted((REPO / package).rglob("*.py")) if path != contract
             for line, text in code_strings(path) if text in NAMES or "checkpoint-(" in text]
    assert found == []


def test_the_names_check_sees_a_file_name_and_a_checkpoint_pattern(tmp_path):
    module = tmp_path / "m.py"
    module.write_text('"""Reads run.json."""\nimport re\nRUN = "run.json"\nSTEP = re.compile(r"checkpoint-(\\d+)")\n')
    assert [text for _, text in code_strings(module) if text in NAMES or "checkpoint-(" in text] == [
        "run.json", r"checkpoint-(\d+)"]
