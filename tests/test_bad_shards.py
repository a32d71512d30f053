"""A truncated or corrupt parquet shard into the commands that read shard folders (issue #47,
item 11): one paragraph naming the file, exit 2, no traceback, nothing written."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest
from rl_prompts import arithmetic_rows, write_rl_shards
from typer.testing import CliRunner

from rufus_data.base.errors import RufusError
from rufus_data.cli import app
from rufus_data.folders.shards import DATA_DIR, read_shards
from rufus_data.rollouts.filter import FilterConfig, filter_prompts

runner = CliRunner()


def damaged(folder: Path, how: str) -> Path:
    """The folder's second shard cut short (its footer gone) or with its middle overwritten."""
    path = sorted((folder / DATA_DIR).glob("train-*.parquet"))[1]
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2] if how == "truncated" else
                     data[:4] + b"\xff" * (len(data) - 12) + data[-8:])
    return path


@pytest.fixture(params=["truncated", "corrupt"])
def bad_rl_shards(request, tmp_path) -> tuple[Path, Path]:
    folder = write_rl_shards(tmp_path / "rl", arithmetic_rows(8))
    table = read_shards(folder)
    from rufus_data.folders.shards import write_shards

    write_shards(table, tmp_path / "two", shard_rows=max(1, table.num_rows // 2))
    return tmp_path / "two", damaged(tmp_path / "two", request.param)


@pytest.mark.parametrize("command", ["inspect", "dedup", "decontam"])
def test_a_damaged_shard_is_named_by_the_commands_that_read_it(bad_rl_shards, tmp_path, command):
    folder, bad = bad_rl_shards
    args = {"inspect": ["inspect", str(folder)], "dedup": ["dedup", str(folder), "--out", str(tmp_path / "out")],
            "decontam": ["decontam", str(folder), "--against", "gsm8k", "--out", str(tmp_path / "out")]}[command]
    result = runner.invoke(app, args)
    text = " ".join(result.output.split())
    assert result.exit_code == 2, result.output
    assert f"{bad} is not a readable parquet shard" in text and "Traceback" not in result.output
    assert not (tmp_path / "out").exists()


def test_filter_names_a_damaged_shard_before_any_generation(bad_rl_shards, tmp_path, tiny_model):
    folder, bad = bad_rl_shards
    with pytest.raises(RufusError, match=f"{bad} is not a readable parquet shard"):
        filter_prompts([folder], tmp_path / "out", FilterConfig(policy="tiny-random", reward=["final_number"], k=2))
    assert not (tmp_path / "out").exists()


def test_tables_still_read(tmp_path):
    from rufus_data.folders.shards import write_shards

    write_shards(pa.table({"id": ["a", "b"]}), tmp_path / "ok")
    assert read_shards(tmp_path / "ok").column("id").to_pylist() == ["a", "b"]
