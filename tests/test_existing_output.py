"""Issue 47 items 1-3: one rule for an output that exists. Without --overwrite every writer refuses
it; with it, only a folder a Rufus command wrote (or an empty one) is replaced, never a folder of a
user's own files; `rufus-eval suite --name` is one folder name under outputs/eval."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rufus_data.base.errors import RufusError
from rufus_data.cli import app as data_app
from rufus_data.folders.shards import atomic_output_dir, refuse_existing_output
from rufus_eval.cli import app as eval_app

EVAL = ["suite", "quick", "--ckpt", "tiny-random", "--limit", "1", "--repeats", "1", "--max-tokens", "8",
        "--backend", "hf"]


def flat(text: str) -> str:
    return " ".join(text.split())


def users_folder(path: Path) -> Path:
    path.mkdir(parents=True)
    (path / "notes.txt").write_text("my notes")
    return path


def test_overwrite_replaces_only_what_rufus_wrote(tmp_path):
    mine = users_folder(tmp_path / "mine")
    with pytest.raises(RufusError, match="already exists: pass --overwrite"):
        refuse_existing_output(mine, overwrite=False)
    refused = pytest.raises(RufusError, match=r"not written by Rufus .*it holds notes.txt. --overwrite replaces only")
    with refused, atomic_output_dir(mine, overwrite=True) as tmp:
        (tmp / "manifest.json").write_text("{}")
    assert (mine / "notes.txt").read_text() == "my notes"
    (tmp_path / "file").write_text("x")
    with pytest.raises(RufusError, match="is a file"):
        refuse_existing_output(tmp_path / "file", overwrite=True)
    for record in ("manifest.json", "run.json", "results.json", "job.json", "rufus-merged.json"):
        ours = tmp_path / record.split(".")[0]
        ours.mkdir()
        (ours / record).write_text("{}")
        with atomic_output_dir(ours, overwrite=True) as tmp:
            (tmp / "new.txt").write_text("new")
        assert sorted(p.name for p in ours.iterdir()) == ["new.txt"]
    (tmp_path / "empty").mkdir()
    refuse_existing_output(tmp_path / "empty", overwrite=True)  # nothing to lose


def test_mix_and_stage_overwrite_refuse_a_users_folder(tmp_path, data_root):
    """Probe 3: `--overwrite` deleted a folder that held only a user's file."""
    src = tmp_path / "rows.jsonl"
    src.write_text("".join(json.dumps({"instruction": f"q{i}", "output": f"a{i}"}) + "\n" for i in range(10)))
    catalog = tmp_path / "c.yaml"
    catalog.write_text(f"kind: sft\nname: c\nsources:\n  - name: s\n    path: {src}\n    share: 1.0\n")
    out = users_folder(tmp_path / "out")
    res = CliRunner().invoke(data_app, ["mix", str(catalog), "--out", str(out), "--overwrite"])
    assert res.exit_code == 2 and "it holds notes.txt" in flat(res.output), res.output
    assert (out / "notes.txt").exists()
    import example_shards

    from rufus_train.cli import app as train_app

    sft = example_shards.gsm8k_sft(data_root, tmp_path / "sft", limit=4)
    run = users_folder(tmp_path / "run")
    res = CliRunner().invoke(train_app, ["stage", "sft", "--data", str(sft), "--output_dir", str(run),
                                         "--model", "tiny-random", "--overwrite", "--dry-run"])
    assert res.exit_code == 2 and "not written by Rufus" in flat(res.output) and (run / "notes.txt").exists()


def test_eval_suite_never_replaces_an_existing_folder_unasked(tmp_path, data_root, monkeypatch):
    """Probe 1: a folder holding notes.txt was replaced by `rufus-eval suite --out DIR`, exit 0; a
    re-run with other --tasks on the same --out discarded the earlier results."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    runner = CliRunner()
    out = users_folder(tmp_path / "DIR")
    res = runner.invoke(eval_app, [*EVAL, "--tasks", "gsm8k", "--out", str(out)])
    assert res.exit_code == 2 and "already exists: pass --overwrite" in flat(res.output), res.output
    res = runner.invoke(eval_app, [*EVAL, "--tasks", "gsm8k", "--out", str(out), "--overwrite"])
    assert res.exit_code == 2 and "it holds notes.txt" in flat(res.output), res.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["DIR"] and (out / "notes.txt").exists()
    run = tmp_path / "run"
    assert runner.invoke(eval_app, [*EVAL, "--tasks", "gsm8k", "--out", str(run)]).exit_code == 0
    first = (run / "results.json").read_text()
    again = runner.invoke(eval_app, [*EVAL, "--tasks", "gsm8k", "--out", str(run), "--dry-run"])
    assert again.exit_code == 2 and "already exists: pass --overwrite" in flat(again.output)
    assert (run / "results.json").read_text() == first
    replaced = runner.invoke(eval_app, [*EVAL, "--tasks", "gsm8k", "--out", str(run), "--overwrite"])
    assert replaced.exit_code == 0, replaced.output
    assert json.loads((run / "results.json").read_text())["run"] != json.loads(first)["run"]


@pytest.mark.parametrize("name", ["../sft", "..", ".", "a/b", ".hidden", ""])
def test_eval_suite_name_is_one_folder_name(name, tmp_path, monkeypatch):
    """Probe 2: `--name ../sft` replaced a mix output; `--name ..` ended in an EBUSY traceback."""
    monkeypatch.chdir(tmp_path)
    sft = users_folder(tmp_path / "outputs" / "sft")
    res = CliRunner().invoke(eval_app, [*EVAL, "--tasks", "gsm8k", "--name", name])
    assert res.exit_code == 2 and "is not a folder name" in flat(res.output), res.output
    assert "Traceback" not in res.output and sorted(p.name for p in (tmp_path / "outputs").iterdir()) == ["sft"]
    assert (sft / "notes.txt").exists()
