"""Pushes against a loopback stand-in for the Hub (tests/hub_stub.py): `rufus-data push` sends
an output folder as a private dataset repo, its card's configs arrive intact, bad input is
refused before anything is sent."""

from __future__ import annotations

import json
from pathlib import Path

import datasets
import yaml
from hub_stub import HubStub, hub
from huggingface_hub import DatasetCard
from typer.testing import CliRunner

from rufus_data.cli import app
from rufus_data.mix import mix

_ = hub  # the fixture, used by name


def received(stub: HubStub, repo_id: str, into: Path) -> Path:
    """The files the stand-in received for a repo, written out as a folder (as a clone would be)."""
    for name, content in stub.repos[repo_id].files.items():
        (into / name).parent.mkdir(parents=True, exist_ok=True)
        (into / name).write_bytes(content)
    return into


def test_data_push_sends_the_folder_as_a_private_dataset_repo(hub, tmp_path, data_root):
    rows = (data_root / "gsm8k/test.jsonl").read_text().splitlines(keepends=True)[:40]
    (tmp_path / "gsm.jsonl").write_text("".join(rows))
    catalog = tmp_path / "catalog.yaml"
    catalog.write_text(yaml.safe_dump({"kind": "sft", "name": "gsm", "tokenizer": "tiny-random", "sources": [
        {"name": "gsm8k_test", "path": str(tmp_path / "gsm.jsonl"), "format": "question_answer", "share": 1.0}]}))
    out = mix(catalog, tmp_path / "mix", {"holdout": 10}).out
    result = CliRunner().invoke(app, ["push", str(out), "my-org/gsm-mix"])
    assert result.exit_code == 0, result.output
    repo = hub.repos["my-org/gsm-mix"]
    assert repo.type == "dataset" and repo.private
    local = sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file())
    assert sorted(repo.files) == local
    assert {"README.md", "manifest.json", "report.md", "data/train-00000-of-00001.parquet",
            "data/holdout-00000-of-00001.parquet"} <= set(repo.files)
    card = DatasetCard(repo.files["README.md"].decode())
    print("stand-in Hub received:", json.dumps({"repo": "my-org/gsm-mix", "type": repo.type, "private": repo.private,
                                                "files": sorted(repo.files), "commits": repo.commits}, indent=1))
    print("card metadata:", json.dumps(card.data.to_dict(), indent=1))
    assert card.data.configs[0]["config_name"] == "default" and card.data.pretty_name == "mix"
    assert [split["split"] for split in card.data.configs[0]["data_files"]] == ["train", "holdout"]
    assert [path for _, path, _ in hub.pushes()] == ["/api/repos/create", "/api/validate-yaml",
                                                     "/api/datasets/my-org/gsm-mix/preupload/main",
                                                     "/api/datasets/my-org/gsm-mix/commit/main"]
    assert all(auth == "Bearer hf_stand_in_token" for _, _, auth in hub.pushes())  # HF_TOKEN, as huggingface_hub reads it
    clone = received(hub, "my-org/gsm-mix", tmp_path / "clone")
    loaded = datasets.load_dataset(str(clone), cache_dir=str(tmp_path / "hf-cache"))
    assert {split: table.num_rows for split, table in loaded.items()} == {"train": 30, "holdout": 10}
    again = CliRunner().invoke(app, ["push", str(out), "my-org/gsm-mix", "--public"])
    assert again.exit_code == 0 and hub.repos["my-org/gsm-mix"].private  # an existing repo keeps its visibility


def test_push_refuses_what_is_not_an_output_folder_before_sending(hub, tmp_path):
    (tmp_path / "loose").mkdir()
    result = CliRunner().invoke(app, ["push", str(tmp_path / "loose"), "my-org/x"])
    assert result.exit_code == 2 and "has no README.md or manifest.json" in result.output
    result = CliRunner().invoke(app, ["push", str(tmp_path / "loose"), "no-owner"])
    assert result.exit_code == 2 and "names no owner: write ORG/NAME" in result.output
    assert "Traceback" not in result.output and hub.pushes() == []
