"""Where catalogs are (rufus_data/catalog_files.py): the user's own catalogs/ first, then the
shipped ones; a missing catalog names both places; `rufus-data catalogs list / copy`. The
installed wheel is tests/test_wheel.py's."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from rufus_data.benchmarks.suite import known_suites, suite_path
from rufus_data.catalog_files import (
    catalog_file,
    copy_shipped,
    is_shipped,
    resolve_entry,
    shipped_catalogs,
    shipped_root,
)
from rufus_data.cli import app as data_app
from rufus_data.errors import RufusError
from rufus_data.inputs import data_input
from rufus_train.launch import accelerate_config_path

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def empty_folder(tmp_path, monkeypatch) -> Path:
    """A working folder outside the checkout, without catalogs of its own."""
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_from_a_checkout_the_shipped_catalogs_are_its_catalogs_folder():
    assert shipped_root() == REPO / "catalogs"
    listed = shipped_catalogs()
    assert {"stages/sft.yaml", "suites/quick.yaml", "benchmarks.yaml", "samples/rl_arithmetic.jsonl"} <= set(listed)
    assert "__init__.py" not in listed


def test_an_empty_folder_reads_the_shipped_catalogs(empty_folder):
    assert resolve_entry("catalogs/rl.yaml") == shipped_root() / "rl.yaml"
    assert catalog_file("stages/sft.yaml") == shipped_root() / "stages" / "sft.yaml"
    assert accelerate_config_path("ddp") == shipped_root() / "accelerate" / "ddp.yaml"
    assert suite_path("quick") == shipped_root() / "suites" / "quick.yaml"
    assert data_input("catalogs/data/sft_mixture.yaml").shipped  # a stage's default data


def test_the_users_own_catalogs_come_first(empty_folder):
    for relative in ("rl.yaml", "stages/sft.yaml", "accelerate/ddp.yaml", "suites/mine.yaml"):
        (empty_folder / "catalogs" / relative).parent.mkdir(parents=True, exist_ok=True)
        (empty_folder / "catalogs" / relative).write_text("# mine\n")
    assert resolve_entry("catalogs/rl.yaml") == Path("catalogs/rl.yaml")
    assert not data_input("catalogs/rl.yaml").shipped
    assert catalog_file("stages/sft.yaml") == Path("catalogs/stages/sft.yaml")
    assert accelerate_config_path("ddp") == Path("catalogs/accelerate/ddp.yaml")
    assert "mine" in known_suites() and "quick" in known_suites()
    assert catalog_file("stages/dpo.yaml") == shipped_root() / "stages" / "dpo.yaml"  # the rest stay shipped


def test_a_path_the_user_names_is_read_as_given(empty_folder):
    mine = empty_folder / "elsewhere" / "mix.yaml"
    mine.parent.mkdir()
    mine.write_text("# mine\n")
    assert resolve_entry(mine) == mine and not is_shipped(mine)
    assert resolve_entry("not-here.yaml") == Path("not-here.yaml")  # its reader reports it


def test_a_missing_catalog_names_both_places(empty_folder):
    with pytest.raises(RufusError) as err:
        resolve_entry("catalogs/data/nope.yaml")
    message = str(err.value)
    assert str(empty_folder / "catalogs" / "data" / "nope.yaml") in message
    assert str(shipped_root() / "data" / "nope.yaml") in message
    with pytest.raises(RufusError, match="no suite named 'nope'.*your catalogs.*shipped ones"):
        suite_path("nope")


def test_a_users_stage_config_is_what_the_stage_loads(empty_folder):
    from rufus_train.config import load_stage_config
    from rufus_train.stages import get_stage

    copy_shipped("stages/sft.yaml")
    stage = empty_folder / "catalogs" / "stages" / "sft.yaml"
    raw = yaml.safe_load(stage.read_text())
    stage.write_text(yaml.safe_dump({**raw, "max_length": 77}))
    assert load_stage_config("sft", get_stage("sft").config_class).max_length == 77


def test_copy_starts_from_the_shipped_file_and_keeps_an_existing_one(empty_folder):
    runner = CliRunner()
    res = runner.invoke(data_app, ["catalogs", "copy", "stages/sft.yaml"])
    assert res.exit_code == 0, res.output
    copied = empty_folder / "catalogs" / "stages" / "sft.yaml"
    assert copied.read_bytes() == (shipped_root() / "stages" / "sft.yaml").read_bytes()
    copied.write_text("# edited\n")
    res = runner.invoke(data_app, ["catalogs", "copy", "stages/sft.yaml"])
    assert res.exit_code == 2 and "--overwrite" in res.output
    assert copied.read_text() == "# edited\n"
    assert runner.invoke(data_app, ["catalogs", "copy", "catalogs/stages/sft.yaml", "--overwrite"]).exit_code == 0
    assert copied.read_bytes() == (shipped_root() / "stages" / "sft.yaml").read_bytes()
    res = runner.invoke(data_app, ["catalogs", "copy", "suites/quick.yaml", "mine"])  # a folder that does not exist: a file
    assert res.exit_code == 0 and (empty_folder / "mine").read_bytes() == (shipped_root() / "suites/quick.yaml").read_bytes()
    res = runner.invoke(data_app, ["catalogs", "copy", "stages/nope.yaml"])
    assert res.exit_code == 2 and "catalogs list" in res.output


def test_list_names_every_shipped_catalog_and_what_overrides_it(empty_folder):
    copy_shipped("stages/dpo.yaml")
    res = CliRunner().invoke(data_app, ["catalogs", "list"])
    assert res.exit_code == 0, res.output
    rows = {line.split("│")[1].strip(): line.split("│")[2].strip() for line in res.output.splitlines()
            if line.startswith("│")}
    assert set(rows) == set(shipped_catalogs())
    assert rows["stages/dpo.yaml"] == "catalogs/stages/dpo.yaml" and rows["stages/sft.yaml"] == "shipped"
