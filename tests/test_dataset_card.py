"""Every kind of output folder loads with `datasets.load_dataset(OUT)` as the step means it: a
mix's splits (holdout included), decontam's and dedup's, filter's `learnable` by default with
one config per non-empty bucket and `rollouts` its own, pairs; and the card says where the rows
came from (sources, lineage, benchmarks checked)."""

from __future__ import annotations

import json
import shutil

import datasets
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from huggingface_hub import DatasetCard
from rl_prompts import NUMBER_REWARD, arithmetic_rows, gsm8k_rows, write_rl_shards
from typer.testing import CliRunner

from rufus_data.cli import app
from rufus_data.decontam import decontam
from rufus_data.decontam.config import DecontamConfig
from rufus_data.dedup import dedup
from rufus_data.folders.dataset_card import write_dataset_card
from rufus_data.folders.shards import read_manifest, write_shards
from rufus_data.mix import mix
from rufus_data.rollouts.filter import FilterConfig, filter_prompts, rebucket

datasets.disable_progress_bars()


def load(folder, config=None, **kwargs) -> dict[str, int]:
    """Rows per split of `load_dataset(folder[, config])`, from a cache of the test's own."""
    loaded = datasets.load_dataset(str(folder), config, cache_dir=str(folder.parent / "hf-cache"), **kwargs)
    return {split: table.num_rows for split, table in loaded.items()}


def configs(folder) -> list[str]:
    return datasets.get_dataset_config_names(str(folder))


@pytest.fixture(scope="module")
def chain(tmp_path_factory, data_root, hub_offline_module):
    """mix (with a holdout) -> decontam against GSM8K -> dedup, on Code Alpaca and 60 GSM8K test items."""
    root = tmp_path_factory.mktemp("cards")
    leaked = root / "gsm8k_test60.jsonl"
    leaked.write_text("".join((data_root / "gsm8k/test.jsonl").read_text().splitlines(keepends=True)[:60]))
    catalog = root / "catalog.yaml"
    catalog.write_text(yaml.safe_dump({"kind": "sft", "name": "tiny", "tokenizer": "tiny-random", "seed": 1, "sources": [
        {"name": "code_alpaca", "path": str(data_root / "code_alpaca_2k/code_alpaca_2k.jsonl"), "share": 0.9},
        {"name": "gsm8k_test", "path": str(leaked), "format": "question_answer", "share": 0.1}]}))
    mix(catalog, root / "mix", {"holdout": 20, "on_bad_row": "skip"})
    decontam(root / "mix", root / "clean", DecontamConfig(against=["gsm8k"], workers=1))
    dedup(root / "clean", root / "dedup")
    return root


@pytest.fixture(scope="module")
def hub_offline_module():
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("HF_HUB_OFFLINE", "1")
        patch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
        yield


def test_mix_loads_train_and_holdout(chain):
    out = chain / "mix"
    counts = read_manifest(out)["counts"]
    assert configs(out) == ["default"]
    assert load(out) == {"train": counts["rows_train"], "holdout": counts["rows_holdout"]} == {"train": 670, "holdout": 40}
    card = DatasetCard.load(out / "README.md")
    assert card.data.pretty_name == "mix" and "sft" in card.data.tags
    assert "| code_alpaca | 630 | 0.9 |" in card.text and "| gsm8k_test | 40 | 0.1 |" in card.text
    assert "No decontam step checked these rows" in card.text
    # "tokens" is one thing in the card, the mix report and the mix table: the basis tokens, named
    manifest = read_manifest(out)
    basis = manifest["basis"]
    alpaca = next(s for s in manifest["sources"] if s["name"] == "code_alpaca")
    report = (out / "report.md").read_text()
    assert f"{basis} tokens |" in card.text and f"{basis} tokens |" in report
    assert f"| {alpaca['tokens']['basis']:,} |" in card.text and f"| {alpaca['tokens']['basis']} |" in report


def test_decontam_loads_clean_rows_and_its_hits_as_a_config(chain):
    out = chain / "clean"
    manifest = read_manifest(out)
    assert configs(out) == ["default", "contaminated"]
    assert load(out) == {"train": 630, "holdout": 20}
    assert sum(load(out).values()) == manifest["counts"]["rows_out"]
    assert load(out, "contaminated") == {"train": pq.read_metadata(out / "contaminated.parquet").num_rows}
    card = DatasetCard.load(out / "README.md")
    assert "| gsm8k | 60 |" in card.text  # the decontamination summary: benchmark, rows removed
    assert "`decontam (against gsm8k) <- mix " in card.text and "| code_alpaca | 630 |" in card.text


def test_dedup_card_carries_the_lineage_and_checks_below_it(chain):
    out = chain / "dedup"
    assert configs(out) == ["default"]  # no clusters: no empty config
    assert load(out) == {"train": 630, "holdout": 20}
    text = DatasetCard.load(out / "README.md").text
    assert "`dedup <- decontam (against gsm8k) <- mix " in text and "| gsm8k | 60 |" in text
    assert "rufus-data dedup (called from Python)" in text


@pytest.fixture(scope="module")
def filtered(tmp_path_factory, data_root, tiny_model, hub_offline_module):
    """filter on tiny-random (every prompt fails: learnable empty), then re-bucketed from rollouts
    whose rewards are set so that every bucket of the band has prompts."""
    root = tmp_path_factory.mktemp("filter-cards")
    shards = write_rl_shards(root / "rl", arithmetic_rows(6) + gsm8k_rows(data_root, 2))
    write_shards(pa.Table.from_pylist(arithmetic_rows(9)[6:]), shards, split="holdout")
    config = FilterConfig(policy="tiny-random", reward=[NUMBER_REWARD], backend="hf", k=2, max_tokens=4, seed=0,
                          temperature=0.7)
    filter_prompts([shards], root / "out", config)
    edited = root / "edited"
    shutil.copytree(root / "out", edited)
    rollouts = pq.read_table(edited / "rollouts.parquet")
    rewards = {"add-1-1": [1.0, 1.0], "add-2-3": [1.0, 0.0], "add-4-5": [0.0, 1.0]}
    seen: dict[str, int] = {}
    column = []
    for prompt in rollouts.column("prompt_id").to_pylist():
        column.append(rewards.get(prompt, [0.0, 0.0])[seen.get(prompt, 0)])
        seen[prompt] = seen.get(prompt, 0) + 1
    index = rollouts.schema.get_field_index("reward")
    pq.write_table(rollouts.set_column(index, "reward", pa.array(column, rollouts.schema.field(index).type)),
                   edited / "rollouts.parquet")
    rebucket(edited, root / "rebucketed", keep="0<p<1")
    return root


def test_filter_with_an_empty_learnable_bucket_still_loads_its_buckets(filtered):
    out = filtered / "out"
    counts = read_manifest(out)["counts"]
    assert counts["learnable"] == 0 and counts["all_pass"] == 0 and counts["all_fail"] == 8
    assert configs(out) == ["learnable", "all_fail", "rollouts"]  # empty buckets are no configs: datasets cannot load them
    assert load(out) == {"holdout": 3}  # learnable by default: no prompt to train on, the input's holdout beside it
    assert load(out, "all_fail") == {"train": 8}
    assert load(out, "rollouts") == {"train": 16}
    text = DatasetCard.load(out / "README.md").text
    assert "| `learnable` (default) | train | 0 | empty: left out of the configs" in text
    assert "| `all_pass` | train | 0 | empty: left out" in text
    shutil.rmtree(out / "learnable" / "data")
    (out / "learnable" / "data").mkdir()
    pq.write_table(pa.table({"id": pa.array([], pa.string())}), out / "learnable" / "data" / "train-00000-of-00001.parquet")
    write_dataset_card(out, read_manifest(out), "out")  # no holdout either: no default, never every bucket as one
    with pytest.raises(ValueError, match="Config name is missing"):
        load(out)


def test_filter_loads_learnable_by_default_with_the_holdout(filtered):
    out = filtered / "rebucketed"
    counts = read_manifest(out)["counts"]
    assert (counts["all_pass"], counts["learnable"], counts["all_fail"]) == (1, 2, 5)
    assert configs(out) == ["learnable", "all_fail", "all_pass", "rollouts"]
    assert load(out) == {"train": 2, "holdout": 3}  # the input's holdout travels with learnable
    assert set(datasets.load_dataset(str(out), split="train", cache_dir=str(filtered / "hf-cache"))["id"]) == {
        "add-2-3", "add-4-5"}
    assert load(out, "all_pass") == {"train": 1} and load(out, "all_fail") == {"train": 5}
    assert load(out, "rollouts") == {"train": 16}
    assert load(out / "learnable") == {"train": 2, "holdout": 3}  # each bucket folder has its own card
    card = DatasetCard.load(out / "README.md")
    assert card.data.pretty_name == "rebucketed"
    assert DatasetCard.load(out / "learnable" / "README.md").data.pretty_name == "rebucketed/learnable"


def test_pairs_load_and_say_how_they_were_made(tmp_path, data_root, hub_offline):
    shards = write_rl_shards(tmp_path / "rl", gsm8k_rows(data_root, 5))
    out = tmp_path / "pairs"
    result = CliRunner().invoke(app, ["pairs", str(shards), "--out", str(out), "--perturb-answer"])
    assert result.exit_code == 0, result.output
    assert load(out) == {"train": 5} == {"train": read_manifest(out)["counts"]["pairs"]}
    row = datasets.load_dataset(str(out), split="train", cache_dir=str(tmp_path / "hf-cache"))[0]
    assert row["chosen"][0]["role"] == "assistant" and row["chosen"] != row["rejected"]
    card = DatasetCard.load(out / "README.md")
    assert [config["config_name"] for config in card.data.configs] == ["default"]
    assert json.loads(card.text.split("counts: `", 1)[1].split("`", 1)[0])["pairs"] == 5
