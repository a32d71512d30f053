"""The Smol playbook's guidance as config-time warnings (rufus_train/guidance.py): each one is
raised by the setting it is about, before anything loads, and not by the recipe's own settings."""

from __future__ import annotations

import warnings

import pytest
import yaml
from conftest import REPO
from typer.testing import CliRunner

from rufus_train.cli import app
from rufus_train.config_loading import load_stage_config, stage_file
from rufus_train.guidance import GuidanceWarning, check_pipeline, check_stage
from rufus_train.pipeline import load_pipeline, stage_configs
from rufus_train.stages import get_stage


def stage(name: str, **overrides):
    return load_stage_config(name, get_stage(name).config_class, stage_file(name), overrides)


def guidance_of(check, *args) -> list[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        check(*args)
    return [str(w.message) for w in caught if issubclass(w.category, GuidanceWarning)]


def test_packing_at_the_unpacked_learning_rate_warns():
    with pytest.warns(GuidanceWarning, match=r"sft: packing at learning_rate 0.0001, the stage's unpacked rate.*"
                      r"the Smol playbook lowers the learning rate when it packs"):
        check_stage(stage("sft", packing=True))
    with pytest.warns(GuidanceWarning, match=r"sft_full: packing at learning_rate 1e-05"):
        check_stage(stage("sft_full", packing=True))
    assert guidance_of(check_stage, stage("sft", packing=True, learning_rate=3e-5)) == []  # lowered: no warning
    assert guidance_of(check_stage, stage("sft")) == []  # no packing
    assert guidance_of(check_stage, stage("midtrain")) == []  # packs by definition


def test_a_preference_stage_over_more_than_one_epoch_warns():
    for name in ("dpo", "kto", "orpo"):
        with pytest.warns(GuidanceWarning, match=rf"{name}: num_train_epochs 3\. The Smol playbook trains preference "
                          r"optimisation for one epoch.*split the data and run another round"):
            check_stage(stage(name, num_train_epochs=3))
        assert guidance_of(check_stage, stage(name)) == []  # one epoch
        assert guidance_of(check_stage, stage(name, num_train_epochs=3, max_steps=10)) == []  # steps decide


def test_a_preference_beta_outside_the_playbook_range_warns():
    """The playbook sweeps beta over 0.01-0.5 (SmolLM3: 0.1); apo_zero is dpo's loss, so it is
    checked too; the length-normalised loss's beta is on another scale and is not."""
    for name, extra in (("dpo", {}), ("dpo", {"loss_type": "apo_zero"}), ("orpo", {}), ("kto", {}), ("online_dpo", {})):
        for beta in (0.005, 2.0):
            messages = guidance_of(check_stage, stage(name, beta=beta, **extra))
            expected = (f"{name}: beta {beta:g} is outside the Smol playbook's 0.01-0.5 range for preference "
                        "optimisation (SmolLM3's best: 0.1); set beta within it, e.g. 0.1")
            assert messages == [expected]
        for beta in (0.01, 0.1, 0.5):
            assert guidance_of(check_stage, stage(name, beta=beta, **extra)) == []
    assert guidance_of(check_stage, stage("dpo", beta=5.0, loss_type="sigmoid_norm")) == []  # Tulu 3's per-token beta


def pipeline_file(tmp_path, sft_lr: float, dpo_lr: float, dpo_lora: bool = True):
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump({"name": "p", "output_dir": str(tmp_path / "runs"), "stages": [
        {"stage": "sft", "learning_rate": sft_lr},
        {"stage": "dpo", "learning_rate": dpo_lr, "lora": {"enabled": dpo_lora}}]}))
    return path


def test_a_preference_rate_not_5_to_20x_below_sft_warns(tmp_path):
    close = stage_configs(load_pipeline(pipeline_file(tmp_path, 1e-4, 5e-5)))
    with pytest.warns(GuidanceWarning, match=r"dpo: learning_rate 5e-05 is 2x below the sft stage it follows \(0.0001\)"
                      r"; the Smol playbook sets the preference learning rate 5-20x below SFT's.*Try learning_rate 1e-05"):
        check_pipeline(close)
    far = stage_configs(load_pipeline(pipeline_file(tmp_path, 1e-4, 1e-7)))
    with pytest.warns(GuidanceWarning, match=r"1e\+03x below.*barely moves the model"):
        check_pipeline(far)
    assert guidance_of(check_pipeline, stage_configs(load_pipeline(pipeline_file(tmp_path, 1e-4, 1e-5)))) == []
    # a full fine-tuning DPO after a LoRA SFT: their rates are not comparable (LoRA's about 10x higher)
    assert guidance_of(check_pipeline, stage_configs(load_pipeline(pipeline_file(tmp_path, 1e-4, 5e-5, False)))) == []


def test_the_warning_reaches_the_user_at_config_time(tmp_path):
    """`pipeline --dry-run` says it, loading nothing; the shipped tulu3_mini ships its notebook's DPO
    rate (2x below SFT's), and the warning says the rate is the recipe's."""
    result = CliRunner().invoke(app, ["pipeline", str(pipeline_file(tmp_path, 1e-4, 5e-5)), "--dry-run"])
    assert result.exit_code == 0, result.output
    assert "warning: dpo: learning_rate 5e-05 is 2x below the sft stage" in " ".join(result.output.split())
    result = CliRunner().invoke(app, ["pipeline", str(REPO / "catalogs/pipelines/tulu3_mini.yaml"), "--dry-run"])
    assert result.exit_code == 0, result.output
    said = " ".join(result.output.split())
    # said once: the console's line, not Python's copy of the warning beside it (SaidWarning)
    assert said.count("dpo: learning_rate 5e-05 is 2x below the sft stage") == 1 and "GuidanceWarning" not in said
    assert ("This pipeline ships 5e-05 because its recipe sets it (the Tulu 3 mini notebook's CFG, "
            "shared/seeds/003_d17be3c0c87e36f6.txt): the run reproduces the recipe, the playbook would not") in said
