"""`filter:` in a GRPO stage: the stage filters its prompts with its starting model (rufus-data
filter) and trains only on the learnable bucket, recorded in the lineage; a filter that leaves
nothing stops with the measured buckets; bad settings are refused before anything loads.

Which prompts are learnable is decided by a scripted reward (registered for these tests), not by
what the tiny random model writes: a row's `expected_output` says pass (every sample 1), fail
(every sample 0) or mixed (samples alternate 1 and 0)."""

from __future__ import annotations

import json
from typing import ClassVar

import pytest
from rl_prompts import write_rl_shards
from train_helpers import run_tiny, tiny_config

from rufus_data.base.errors import RufusError
from rufus_data.folders.run_folder import LINEAGE_JSON, RUN_JSON
from rufus_data.rewards import registry
from rufus_data.rewards.contract import RewardFunction
from rufus_train.config_loading import resolved_yaml
from rufus_train.pipeline import PipelineConfig, stage_configs
from rufus_train.stages import check_config


class ScriptedReward(RewardFunction):
    """1 for a `pass` row, 0 for a `fail` row, alternately 1 and 0 for a `mixed` row; the ids the
    trainer scored (a call carrying `trainer_state`) are kept in `trained_ids`."""

    name = "scripted"
    trained_ids: ClassVar[set[str]] = set()

    def __init__(self, only_label: str | None = None):
        super().__init__(only_label)
        self.turn = 0

    def __call__(self, prompts=None, completions=None, completion_ids=None, **kwargs):
        if "trainer_state" in kwargs:
            ScriptedReward.trained_ids.update(kwargs["id"])
        return super().__call__(prompts, completions, completion_ids, **kwargs)

    def score_rows(self, prompts, texts, closed, rows, log_metric):
        scores = []
        for row in rows:
            if row["expected_output"] == "mixed":
                self.turn += 1
                scores.append(float(self.turn % 2))
            else:
                scores.append(1.0 if row["expected_output"] == "pass" else 0.0)
        return scores


@pytest.fixture
def scripted(monkeypatch):
    monkeypatch.setitem(registry.REWARDS, "scripted", ScriptedReward)
    ScriptedReward.trained_ids = set()
    return ScriptedReward


def rows(kinds: dict[str, int]) -> list[dict]:
    return [{"id": f"{kind}-{i}", "source": "test", "label": "test", "expected_output": kind,
             "prompt": [{"role": "user", "content": f"Say something about {kind} number {i}."}]}
            for kind, count in kinds.items() for i in range(count)]


FILTERED = {"model": "tiny-random", "rewards": [{"name": "scripted"}], "filter": {"k": 4, "backend": "hf"}, "max_rows": None,
            "num_generations": 2, "per_device_train_batch_size": 4, "max_completion_length": 8, "learning_rate": 1e-4}


@pytest.mark.train
def test_a_filtered_stage_trains_only_on_the_learnable_rows_and_records_them(scripted, tiny_model, tmp_path):
    data = write_rl_shards(tmp_path / "prompts", rows({"pass": 2, "mixed": 3, "fail": 2}))
    result = run_tiny("coding_rl", data, tmp_path / "runs" / "coding_rl", **FILTERED)
    assert result.global_step == 2
    assert scripted.trained_ids and scripted.trained_ids <= {"mixed-0", "mixed-1", "mixed-2"}, scripted.trained_ids
    lineage = json.loads((result.output_dir / LINEAGE_JSON).read_text())
    out = tmp_path / "runs" / "filtered"
    (folder,) = out.iterdir()
    assert lineage["filter"]["out"] == str(folder) and folder.name.startswith("coding_rl-")
    assert lineage["filter"]["counts"]["learnable"] == 3 and lineage["filter"]["rows"] == 3
    assert (lineage["filter"]["counts"]["all_pass"], lineage["filter"]["counts"]["all_fail"]) == (2, 2)
    assert [entry["entry"] for entry in lineage["data"]] == [str(folder / "learnable")]
    assert lineage["filter"]["data"][0]["entry"] == str(data)  # what was filtered
    assert json.loads((result.output_dir / RUN_JSON).read_text())["lineage"]["filter"]["reused"] is False

    # the same settings again: the filter output is reused, not generated again
    again = run_tiny("coding_rl", data, tmp_path / "runs" / "coding_rl", overwrite=True, **FILTERED)
    lineage = json.loads((again.output_dir / LINEAGE_JSON).read_text())
    assert lineage["filter"]["reused"] is True and lineage["filter"]["out"] == str(folder)
    assert [p.name for p in out.iterdir()] == [folder.name]


@pytest.mark.train
def test_a_filter_that_leaves_nothing_stops_with_the_measured_buckets(scripted, tiny_model, tmp_path):
    data = write_rl_shards(tmp_path / "prompts", rows({"fail": 3, "pass": 1}))
    with pytest.raises(RufusError) as err:
        run_tiny("coding_rl", data, tmp_path / "runs" / "coding_rl", **FILTERED)
    message = str(err.value)
    assert "left 0 prompts in learnable" in message and "all_pass 1, learnable 0, all_fail 3" in message
    assert "too hard for this model" in message and "too easy" in message
    assert not scripted.trained_ids
    assert not (tmp_path / "runs" / "coding_rl" / "adapter_model.safetensors").exists()


@pytest.mark.train
def test_the_all_pass_bucket_can_be_chosen(scripted, tiny_model, tmp_path):
    data = write_rl_shards(tmp_path / "prompts", rows({"pass": 2, "fail": 2}))
    # all_pass groups are dead by definition: the dead-step stop is switched off to train on them
    settings = {**FILTERED, "filter": {"k": 2, "backend": "hf", "buckets": ["all_pass"]}, "stop_after_dead_steps": 0}
    result = run_tiny("coding_rl", data, tmp_path / "runs" / "coding_rl", **settings)
    assert scripted.trained_ids == {"pass-0", "pass-1"}
    assert result.global_step == 2


def test_filter_settings_show_in_the_dry_run_resolved_from_the_stage(tmp_path):
    config = tiny_config("coding_rl", tmp_path, tmp_path / "run", max_rows=None, filter=True, max_completion_length=48,
                         temperature=0.8)
    text = resolved_yaml(config)
    assert "filter:" in text and "max_tokens: 48" in text and "temperature: 0.8" in text and "- learnable" in text
    assert tiny_config("coding_rl", tmp_path, tmp_path / "run", filter=False).filter is None


@pytest.mark.parametrize(("overrides", "said"), [
    ({"filter": {"kk": 4}}, "kk"),
    ({"filter": {"buckets": ["learnabel"]}}, "filter.buckets"),
    ({"filter": {"k": 1}}, "k"),
])
def test_bad_filter_keys_are_refused_when_the_config_loads(tmp_path, overrides, said):
    with pytest.raises(RufusError) as err:
        tiny_config("coding_rl", tmp_path, tmp_path / "run", max_rows=None, **overrides)
    assert said in str(err.value) and "filter" in str(err.value)


@pytest.mark.parametrize(("overrides", "said"), [
    ({"filter": {"keep": "0.9<p<0.1"}, "max_rows": None}, "filter.keep"),
    ({"filter": True, "max_rows": 8}, "filter.limit"),
])
def test_filter_conflicts_are_refused_before_anything_loads(scripted, tmp_path, tiny_model, overrides, said):
    data = write_rl_shards(tmp_path / "prompts", rows({"pass": 2}))
    with pytest.raises(RufusError, match=said.replace(".", r"\.")):
        check_config(tiny_config("coding_rl", data, tmp_path / "run", **{**FILTERED, **overrides}))


def test_a_pipeline_stage_entry_filters_with_the_previous_stage_as_policy(tmp_path):
    pipeline = PipelineConfig(name="p", output_dir=str(tmp_path / "p"), stages=[
        {"stage": "sft", "max_steps": 1}, {"stage": "coding_rl", "filter": {"k": 4}, "max_steps": 1}])
    sft, rl = stage_configs(pipeline, notes=[])
    assert rl.filter is not None and rl.filter.k == 4 and rl.model == sft.output_dir
