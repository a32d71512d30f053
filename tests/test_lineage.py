"""A run knows its data: the lineage of each shard folder (its manifests, back to the mix, with
fingerprints), what it was checked against, the notes a stage prints when its data is ready, and
the check a model's evaluation reads (through a pipeline's earlier stages). In-process, on real
commands: mix, decontam and dedup over a small catalog with one planted GSM8K test question."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from conftest import read_jsonl

from rufus_data.base.errors import RufusError
from rufus_data.decontam import DecontamConfig, decontam
from rufus_data.dedup import DedupConfig, dedup
from rufus_data.folders.lineage import check_against, folder_lineage
from rufus_data.folders.run_folder import LINEAGE_JSON, read_lineage, write_lineage
from rufus_data.folders.shards import DATA_DIR, file_sha256, read_manifest, shard_files
from rufus_data.mix import mix
from rufus_data.sources.inputs import data_input, shard_folder
from rufus_train.config_loading import load_stage_config
from rufus_train.data import prepare_data
from rufus_train.stages import get_stage

NUMBER_REWARD = {"name": "string_match", "extractor": "last_number", "answer_column": "expected_output"}


def toy_catalog(folder: Path, data_root: Path, tokenizer: str, name: str = "toy") -> Path:
    """An rl catalog of additions and one GSM8K test question (a leak decontam must remove)."""
    leak = next(iter(read_jsonl(data_root / "gsm8k" / "test.jsonl", limit=1)))
    rows = [{"question": f"What is {a} + {b}? Answer with just the number.", "answer": str(a + b)}
            for a, b in [(1, 1), (2, 3), (4, 5), (5, 4), (6, 2), (3, 4), (2, 2), (7, 1)]]
    rows.append({"question": leak["question"], "answer": leak["answer"].split("####")[-1].strip()})
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    catalog = {"kind": "rl", "name": name, "tokenizer": tokenizer, "seed": 0, "holdout": 0,
               "sources": [{"name": name, "path": f"{name}.jsonl", "format": "question_answer", "share": 1.0,
                            "reward": NUMBER_REWARD}]}
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(catalog, sort_keys=False))
    return path


@pytest.fixture(scope="module")
def chain(tmp_path_factory, data_root, tiny_model) -> dict[str, Path]:
    """mix -> decontam --against quick -> dedup, as the commands write them."""
    root = tmp_path_factory.mktemp("lineage")
    catalog = toy_catalog(root / "catalog", data_root, tiny_model)
    mix(catalog, root / "mix")
    decontam(root / "mix", root / "clean", DecontamConfig(against=["quick"], workers=1))
    dedup(root / "clean", root / "dedup", DedupConfig(workers=1))
    return {"root": root, "catalog": catalog, "mix": root / "mix", "clean": root / "clean", "dedup": root / "dedup"}


def test_the_lineage_follows_the_manifests_back_to_the_mix(chain):
    node = folder_lineage(chain["dedup"])
    assert node["command"] == "rufus-data dedup"
    assert node["fingerprint"] == {p.name: file_sha256(p) for p in shard_files(chain["dedup"])}
    clean = node["inputs"][0]
    assert clean["command"] == "rufus-data decontam" and clean["on_disk"] == "same"
    assert clean["fingerprint"] == read_manifest(chain["dedup"])["inputs"][0]["files"]
    assert clean["config_hash"] == read_manifest(chain["clean"])["config_hash"]
    assert clean["checked"]["against"] == ["quick"]
    assert clean["checked"]["benchmarks"] == {"gsm8k": 1, "humaneval": 0, "ifeval": 0, "math500": 0}
    mixed = clean["inputs"][0]
    assert mixed["command"] == "rufus-data mix" and mixed["catalog"]["path"] == str(chain["catalog"])
    assert [source["source"] for source in mixed["sources"]] == ["toy"] and mixed["inputs"] == []
    assert check_against(None, "gsm8k").status == "no_training_data"  # a base model: no run, no data


def test_a_changed_input_ends_the_chain(chain, tmp_path):
    import shutil

    copy = tmp_path / "clean"
    shutil.copytree(chain["clean"], copy)
    deduped = tmp_path / "dedup"
    dedup(copy, deduped, DedupConfig(workers=1))
    run = tmp_path / "run"
    run.mkdir()
    write_lineage(run, {"version": 1, "base": {"model": "x", "run": None},
                        "data": [{"name": "dedup", "folder": folder_lineage(deduped)}]})
    assert check_against(run, "gsm8k").status == "removed"
    first = shard_files(copy)[0]
    first.write_bytes(first.read_bytes() + b"\0")  # the decontam output changed after dedup read it
    node = folder_lineage(deduped)
    assert node["inputs"][0]["on_disk"] == "changed" and "checked" not in node["inputs"][0]
    write_lineage(run, {"version": 1, "base": {"model": "x", "run": None}, "data": [{"name": "dedup", "folder": node}]})
    check = check_against(run, "gsm8k")
    assert check.flagged and f"{copy} has changed since the next step read it" in check.why


def prepare(entries: list, run: Path, base: str, capsys) -> tuple[dict, str]:
    prepare_data([str(e) for e in entries], run, base, "quick")
    return json.loads((run / LINEAGE_JSON).read_text()), " ".join(capsys.readouterr().err.split())


def test_stage_data_records_its_lineage_and_says_what_was_checked(chain, tmp_path, tiny_model, capsys):
    run = tmp_path / "run"
    lineage, said = prepare([chain["dedup"]], run, tiny_model, capsys)
    assert read_lineage(run) == lineage and lineage["base"] == {"model": tiny_model, "run": None}
    entry = lineage["data"][0]
    assert entry["catalog"] is None and entry["folder"]["command"] == "rufus-data dedup"
    assert (f"data dedup: {chain['dedup']} (dedup <- decontam (against quick) <- mix {chain['catalog']}): checked "
            "against gsm8k (1 row removed), humaneval (clean), ifeval (clean), math500 (clean)") in said
    check = check_against(run, "gsm8k")
    assert (check.status, check.rows_removed, check.text) == ("removed", 1, "checked: 1 row removed")
    assert check_against(run, "math500").text == "checked: clean"
    aime = check_against(run, "aime24")
    assert aime.flagged and aime.text == "NOT CHECKED"
    assert f"{chain['mix']} (mixed from {chain['catalog']}) reached training without a decontam step that checked aime24" in aime.why

    raw = tmp_path / "raw"  # a folder that never went through decontam
    _, said = prepare([chain["mix"]], raw, tiny_model, capsys)
    assert (f"data mix: {chain['mix']} (mix {chain['catalog']}) was NOT decontaminated. To check it: `rufus-data "
            f"decontam {chain['mix']} --against quick --out {chain['mix']}-clean`, then `--data {chain['mix']}-clean`") in said


def test_a_catalog_mixed_at_the_start_says_it_was_not_decontaminated(chain, tmp_path, tiny_model, capsys):
    run = tmp_path / "run"
    lineage, said = prepare([chain["catalog"]], run, tiny_model, capsys)
    entry = lineage["data"][0]
    assert entry["catalog"] == str(chain["catalog"]) and entry["shipped"] is False
    assert entry["folder"]["command"] == "rufus-data mix" and entry["folder"]["path"] == str((run / DATA_DIR / "toy").resolve())
    cat = chain["catalog"]
    assert (f"data toy: your catalog {cat} was mixed at the start of this run and NOT decontaminated: its rows were "
            f"never checked against any benchmark. To train on checked data: `rufus-data mix {cat} --out outputs/toy "
            "&& rufus-data decontam outputs/toy --against quick --out outputs/toy-clean`, then "
            "`--data outputs/toy-clean`") in said
    assert check_against(run, "gsm8k").flagged


def test_a_stage_default_catalog_records_its_lineage(tmp_path, tiny_model, capsys):
    stage = "reasoning_rl"
    config = load_stage_config(stage, get_stage(stage).config_class, overrides={"output_dir": str(tmp_path / "run")})
    lineage, said = prepare(config.data, tmp_path / "run", tiny_model, capsys)
    entry = lineage["data"][0]
    assert entry["entry"] == "catalogs/data/gsm8k_prompts.yaml" and entry["shipped"] is True
    assert entry["folder"]["command"] == "rufus-data mix" and entry["folder"]["catalog"]["sha256"]
    assert "data gsm8k_prompts: the stage's default catalog" in said and "NOT decontaminated" in said
    assert "rufus-data decontam outputs/gsm8k_prompts --against quick --out outputs/gsm8k_prompts-clean" in said
    assert check_against(tmp_path / "run", "gsm8k").flagged


def test_a_pipeline_stage_carries_the_lineage_of_the_stages_below(chain, tmp_path, tiny_model, capsys):
    first, second, third = tmp_path / "01-sft", tmp_path / "02-dpo", tmp_path / "03-rl"
    prepare([chain["clean"]], first, tiny_model, capsys)
    lineage, _ = prepare([chain["clean"]], second, str(first), capsys)
    assert lineage["base"]["run"] == str(first.resolve()) and len(lineage["base"]["lineage_sha256"]) == 64
    assert check_against(second, "gsm8k").rows_removed == 2  # one leak removed for each stage's data
    prepare([chain["catalog"]], third, str(second), capsys)
    assert check_against(third, "gsm8k").flagged  # its own data was never checked
    assert check_against(second, "math500").status == "clean"
    write_lineage(first, {**read_lineage(first), "data": []})  # the first stage trained again, on other data
    check = check_against(second, "gsm8k")
    assert check.flagged and "trained again" in check.why


def test_commands_that_read_one_shard_folder_refuse_a_catalog():
    with pytest.raises(RufusError, match=r"rufus-data decontam reads a shard folder, and catalogs/sft.yaml is a mixture "
                                         r"catalog: mix it first \(`rufus-data mix catalogs/sft.yaml --out outputs/sft`\)"):
        shard_folder("catalogs/sft.yaml", "rufus-data decontam")
    assert data_input("catalogs/sft.yaml").shipped and not data_input("outputs/sft").catalog
