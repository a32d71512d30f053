"""Every data step called from Python the one way, `step(inputs, out, settings)`, with its settings
as the config model and as a dict, writes what its command writes for the same settings: the
same manifest counts and the same rows."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from rl_prompts import NUMBER_REWARD, arithmetic_rows, gsm8k_rows, write_rl_shards
from typer.testing import CliRunner

from rufus_data.cli import app
from rufus_data.decontam import DecontamConfig, DecontamResult, decontam
from rufus_data.dedup import DedupConfig, DedupResult, dedup
from rufus_data.folders.output_step import StepResult
from rufus_data.folders.shards import read_manifest, read_shards
from rufus_data.mix import MixConfig, mix
from rufus_data.rollouts import FilterConfig, PairsConfig, build_pairs, filter_prompts
from rufus_data.sources.catalog import load_catalog

REPO = Path(__file__).resolve().parents[1]
SFT = REPO / "catalogs" / "sft.yaml"


def run_cli(*args: str) -> None:
    result = CliRunner().invoke(app, [str(a) for a in args])
    assert result.exit_code == 0, result.output


def same_output(result: StepResult, folder: Path) -> None:
    """`result` holds what `folder` (the command's output) holds: counts, manifest counts and rows."""
    assert result.counts == read_manifest(folder)["counts"] == read_manifest(result.out)["counts"]
    assert result.manifest["counts"] == result.counts
    assert read_shards(result.out).to_pylist() == read_shards(folder).to_pylist()


@pytest.fixture(scope="module")
def mixed(tmp_path_factory) -> Path:
    """The sample SFT catalog mixed from Python, with settings the command also takes."""
    out = tmp_path_factory.mktemp("face") / "mix"
    result = mix(SFT, out, MixConfig(holdout=4, on_bad_row="skip"))
    assert isinstance(result, StepResult) and result.out == out and result.counts["rows_train"] > 0
    return out


def test_mix_from_python_is_the_command(mixed, tmp_path):
    run_cli("mix", SFT, "--out", tmp_path / "cli", "--holdout", "4", "--on-bad-row", "skip")
    same_output(mix(SFT, tmp_path / "dict", {"holdout": 4, "on_bad_row": "skip"}), tmp_path / "cli")
    same_output(mix(SFT, mixed, {"holdout": 4, "on_bad_row": "skip"}, overwrite=True), tmp_path / "cli")


def test_mix_takes_the_catalog_as_an_object_or_a_dict(mixed, tmp_path):
    catalog = load_catalog(SFT)  # its source paths resolved: the same rows from any folder
    from_object = mix(catalog, tmp_path / "object", {"holdout": 4, "on_bad_row": "skip"})
    same_output(from_object, mixed)
    assert from_object.manifest["catalog"]["path"] is None
    from_dict = mix(catalog.model_dump(mode="json"), tmp_path / "dict", {"holdout": 4, "on_bad_row": "skip"})
    same_output(from_dict, mixed)


def test_settings_as_a_yaml_file_and_bad_keys_named(mixed, tmp_path):
    settings = tmp_path / "dedup.yaml"
    settings.write_text("workers: 1\nthreshold: 0.9\n")
    result = dedup(mixed, None, settings, report_only=True)
    assert result.out is None and result.manifest == {} and result.counts["rows_in"] > 0
    with pytest.raises(Exception, match="did you mean 'threshold'"):
        dedup(mixed, tmp_path / "x", {"treshold": 0.9})


def test_decontam_from_python_is_the_command(mixed, tmp_path):
    run_cli("decontam", mixed, "--against", "gsm8k", "--workers", "1", "--out", tmp_path / "cli")
    model = decontam(mixed, tmp_path / "model", DecontamConfig(against=["gsm8k"], workers=1))
    assert isinstance(model, DecontamResult) and model.manifest["against"] == ["gsm8k"]
    same_output(model, tmp_path / "cli")
    same_output(decontam(mixed, tmp_path / "dict", {"against": ["gsm8k"], "workers": 1}), tmp_path / "cli")
    report = decontam(mixed, None, {"against": ["gsm8k"], "workers": 1}, report_only=True)
    assert report.out is None and report.counts == model.counts


def test_dedup_from_python_is_the_command(mixed, tmp_path):
    run_cli("dedup", mixed, "--workers", "1", "--out", tmp_path / "cli")
    model = dedup(mixed, tmp_path / "model", DedupConfig(workers=1))
    assert isinstance(model, DedupResult)
    same_output(model, tmp_path / "cli")
    same_output(dedup(mixed, tmp_path / "dict", {"workers": 1}), tmp_path / "cli")


@pytest.fixture(scope="module")
def rl_shards(tmp_path_factory, data_root) -> Path:
    return write_rl_shards(tmp_path_factory.mktemp("face-rl") / "rl", arithmetic_rows(3) + gsm8k_rows(data_root, 1))


FILTER = {"policy": "tiny-random", "reward": [NUMBER_REWARD], "backend": "hf", "k": 2, "max_tokens": 4, "seed": 0}


def test_filter_from_python_is_the_command(rl_shards, tiny_model, tmp_path):
    run_cli("filter", rl_shards, "--out", tmp_path / "cli", "--policy", "tiny-random", "--reward",
            json.dumps(NUMBER_REWARD), "--backend", "hf", "--k", "2", "--max-tokens", "4", "--seed", "0")
    for name, settings in (("model", FilterConfig(**FILTER)), ("dict", FILTER)):
        result = filter_prompts([rl_shards], tmp_path / name, settings)
        assert result.counts == read_manifest(tmp_path / "cli")["counts"] and sum(result.counts.values()) == 4
        assert result.manifest["completions"] == 8
        for bucket in ("all_pass", "learnable", "all_fail"):
            ids = read_shards(result.out / bucket).column("id").to_pylist()
            assert ids == read_shards(tmp_path / "cli" / bucket).column("id").to_pylist(), bucket


PAIRS = {"policy": "tiny-random", "perturb_answer": True, "reward": [NUMBER_REWARD], "backend": "hf", "k": 2,
         "max_tokens": 4, "pass_threshold": 0.0}


def test_pairs_from_python_is_the_command(rl_shards, tiny_model, tmp_path):
    run_cli("pairs", rl_shards, "--out", tmp_path / "cli", "--perturb-answer")
    same_output(build_pairs([rl_shards], tmp_path / "dict", {"perturb_answer": True}), tmp_path / "cli")
    model = build_pairs([rl_shards], tmp_path / "model", PairsConfig(perturb_answer=True))
    same_output(model, tmp_path / "cli")
    assert model.manifest["method"] == "reference_perturbed" and model.counts["pairs"] > 0
    sampled = build_pairs([rl_shards], tmp_path / "sampled", PAIRS)
    assert sampled.manifest["method"] == "on_policy_perturbed" and sampled.counts["prompts"] == 4
