"""A full disk and a read-only output folder (issue #47, item 11): the writers stop with one
paragraph naming the output and what to do, exit 2, no traceback, and leave no temporary folder
or lock behind. A real tmpfs (1 MB, or mounted read-only) where this runs as root; a write made to
fail with ENOSPC everywhere else."""

from __future__ import annotations

import contextlib
import errno
import json
import subprocess
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from rufus_data.cli import app
from rufus_data.folders.shards import write_shards

runner = CliRunner()


def chat_rows(n: int) -> list[dict]:
    return [{"id": f"r{i}", "source": "s", "label": "s",
             "messages": [{"role": "user", "content": f"question {i} " * 30},
                          {"role": "assistant", "content": f"answer {i} " * 30}]} for i in range(n)]


@pytest.fixture
def shards(tmp_path) -> Path:
    return write_shards(pa.Table.from_pylist(chat_rows(400)), tmp_path / "in", shard_rows=100)[0].parents[1]


def mix_args(tmp_path: Path, out: Path) -> list[str]:
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps({"prompt": f"q{i} " * 20, "completion": f"a{i} " * 20}) + "\n" for i in range(300)))
    catalog = tmp_path / "c.yaml"
    catalog.write_text(f"kind: sft\nname: c\nsources:\n  - name: src\n    path: {rows}\n    share: 1.0\n")
    return ["mix", str(catalog), "--out", str(out)]


def writer_args(command: str, tmp_path: Path, shards: Path, out: Path) -> list[str]:
    if command == "mix":
        return mix_args(tmp_path, out)
    return [command, str(shards), *(["--against", "gsm8k"] if command == "decontam" else []), "--out", str(out)]


def assert_one_paragraph(result, out: Path, why: str) -> None:
    text = " ".join(result.output.split())
    assert result.exit_code == 2, result.output
    assert f"cannot write output {out}" in text or "cannot write" in text, text
    assert why in text and "Traceback" not in result.output
    assert not out.exists()
    assert [p.name for p in out.parent.iterdir() if p.name.startswith(f".{out.name}.") and "work" not in p.name] == []


@pytest.mark.parametrize("command", ["mix", "dedup", "decontam"])
def test_a_full_disk_while_writing_is_one_paragraph_and_leaves_nothing(tmp_path, shards, monkeypatch, command, data_root):
    out = tmp_path / "out"
    args = writer_args(command, tmp_path, shards, out)

    def full(*_args, **_kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(pq, "write_table", full)
    result = runner.invoke(app, args)
    assert_one_paragraph(result, out, "no space left on the device (ENOSPC)")


@contextlib.contextmanager
def tmpfs(folder: Path, options: str):
    folder.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(folder)], capture_output=True, check=False)
    if mounted.returncode:
        pytest.skip(f"cannot mount a tmpfs here ({mounted.stderr.decode().strip()}): needs root")
    try:
        yield folder
    finally:
        subprocess.run(["umount", str(folder)], check=False)


@pytest.mark.parametrize("command", ["mix", "dedup", "decontam"])
def test_a_real_full_disk_and_a_read_only_folder(tmp_path, shards, command, data_root):
    for options, why in (("size=12k", "no space left on the device (ENOSPC)"),
                         ("ro,size=64k", "the file system is read-only (EROFS")):
        folder = tmp_path / options.replace(",", "-").replace("=", "")
        with tmpfs(folder, options):
            out = folder / "out"
            args = writer_args(command, tmp_path, shards, out)
            result = runner.invoke(app, args)
            assert_one_paragraph(result, out, why)
