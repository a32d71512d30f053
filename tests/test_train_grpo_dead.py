"""A GRPO run that trains nothing says so at once (issue 45): each step's progress line on the
console; after a step whose prompt groups were all dead, the measured cause and its fix; K dead
steps in a row stop the run with exit 2 and no model (`stop_after_dead_steps`), 0 only warns; the
closing warning and the model card give the measured cause. `rufus-train stage reasoning_rl` on
tiny-random (8 completion tokens, 2 per prompt) with rewards that do not read the text, so every
group's fate is known before generation."""

from __future__ import annotations

import json
import re

import pytest
from rl_prompts import arithmetic_rows, write_rl_shards
from typer.testing import CliRunner

from rufus_data.rewards.contract import RewardFunction
from rufus_data.rewards.registry import REWARDS
from rufus_train.cli import app
from rufus_train.grpo.dead_groups import closing_note, dead_share, measured_cause

G = 2
STEP_LINE = r"step {}/{}: loss \S+, reward {}, reward std \S+, dead groups {}, \S+ s/step, ETA \d+:\d\d:\d\d"


class AlwaysZero(RewardFunction):
    """Every completion scores 0: every group is dead, the prompts 'too hard'."""

    name = "always_zero"

    def score_rows(self, prompts, texts, closed, rows, log_metric):
        return [0.0] * len(texts)


class ByPosition(RewardFunction):
    """A completion scores its position in its group (0, 1): no group is ever dead."""

    name = "by_position"

    def score_rows(self, prompts, texts, closed, rows, log_metric):
        return [float(i % G) for i in range(len(texts))]


@pytest.fixture
def shards(tmp_path, monkeypatch):
    monkeypatch.setitem(REWARDS, "always_zero", AlwaysZero)
    monkeypatch.setitem(REWARDS, "by_position", ByPosition)
    return write_rl_shards(tmp_path / "arithmetic", arithmetic_rows(8))


def train(shards, out, reward: str, *options: str):
    args = ["stage", "reasoning_rl", "--model", "tiny-random", "--data", str(shards), "--output_dir", str(out),
            "--rewards", json.dumps([reward]), "--overlong_cache", "null", "--per_device_train_batch_size", "4",
            "--num_generations", str(G), "--max_completion_length", "8", "--max_rows", "8", "--save_steps", "100",
            "--no-gradient_checkpointing", *options]
    return CliRunner().invoke(app, args, env={"COLUMNS": "300"})


@pytest.mark.train
def test_a_reward_of_0_everywhere_stops_after_the_dead_steps_with_the_cause(shards, tmp_path):
    out = tmp_path / "run"
    result = train(shards, out, "always_zero", "--max_steps", "5", "--stop_after_dead_steps", "2")
    shown = " ".join(result.output.split())
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output

    assert re.search(STEP_LINE.format(1, 5, 0, "100%"), shown) and re.search(STEP_LINE.format(2, 5, 0, "100%"), shown)
    assert "step 3/5" not in shown  # stopped after the second dead step
    # after step 1, the warning with the share, the reward mean and the fix that applies
    assert ("warning: step 1/5: every prompt group was dead, its completions all scoring the same (dead groups 100%, "
            "reward mean 0)") in shown
    assert f"rufus-data filter {shards} --policy tiny-random --out FILTERED" in shown
    assert "1 in a row; stop_after_dead_steps stops the run at 2" in shown
    assert "error: stage reasoning_rl stopped at step 2/5: in 2 steps in a row" in shown
    assert "too hard for this model" in shown and "bf16" not in shown and "higher learning rate" not in shown
    run = json.loads((out / "run.json").read_text())
    assert run["stopped"] is True and run["global_step"] == 2
    assert run["dead_groups"] == {"steps": 2, "dead_steps": [1, 2], "dead_share_mean": 1.0, "reward_mean": 0.0,
                                  "cause": "too_hard", "stop_after_dead_steps": 2}
    assert not (out / "adapter_model.safetensors").exists()  # no model saved as the result
    card = (out / "README.md").read_text()
    assert "**Training stopped: no model was saved.**" in card and "too hard for this model" in card
    assert "every group in 2 of 2 logged steps" in card


@pytest.mark.train
def test_warn_only_trains_on_and_the_closing_note_gives_the_measured_cause(shards, tmp_path):
    out = tmp_path / "run"
    result = train(shards, out, "always_zero", "--max_steps", "3", "--stop_after_dead_steps", "0")
    shown = " ".join(result.output.split())
    assert result.exit_code == 0, result.output
    for step in (1, 2, 3):
        assert f"warning: step {step}/3: every prompt group was dead" in shown
    assert shown.count("stop_after_dead_steps: 0, training goes on") == 3
    closing = "warning: nothing was learned: every step's groups were dead (dead groups (equal rewards in"
    assert closing in shown and "averaged 100% over 3 logged steps, reward mean 0); every completion scored 0" in shown
    assert "bf16" not in shown and "higher learning rate" not in shown
    assert (out / "adapter_model.safetensors").exists()
    run = json.loads((out / "run.json").read_text())
    assert run["stopped"] is False and run["global_step"] == 3 and run["dead_groups"]["cause"] == "too_hard"
    assert "nothing was learned: every step's groups were dead" in (out / "README.md").read_text()


@pytest.mark.train
def test_a_run_shorter_than_the_stop_stops_at_its_last_dead_step(shards, tmp_path):
    """The default (3) with --max_steps 2, as the README types a card command: both steps dead is
    the whole run, so it ends with the message and exit 2, not exit 0."""
    result = train(shards, tmp_path / "run", "always_zero", "--max_steps", "2")
    assert result.exit_code == 2 and "stopped at step 2/2: in 2 steps in a row" in " ".join(result.output.split())


@pytest.mark.train
def test_a_stop_of_1_ends_after_the_first_dead_step(shards, tmp_path):
    """coding_rl's setting: the first dead step ends the run (exit 2), the later steps never run."""
    out = tmp_path / "run"
    result = train(shards, out, "always_zero", "--max_steps", "3", "--stop_after_dead_steps", "1")
    shown = " ".join(result.output.split())
    assert result.exit_code == 2 and "stopped at step 1/3: in that step every prompt group was dead" in shown
    assert "step 2/3" not in shown and not (out / "adapter_model.safetensors").exists()


@pytest.mark.train
def test_a_mixed_reward_trains_on_without_a_dead_step(shards, tmp_path):
    out = tmp_path / "run"
    result = train(shards, out, "by_position", "--max_steps", "3", "--stop_after_dead_steps", "1")
    shown = " ".join(result.output.split())
    assert result.exit_code == 0, result.output

    for step in (1, 2, 3):
        assert re.search(STEP_LINE.format(step, 3, 0.5, "0%"), shown), shown
    assert "warning: step" not in shown and "stopped" not in shown
    # the weights of 3 steps at 1e-5 barely move: said with the measured signal, not generic advice
    assert "Measured: no step's groups were all dead (dead groups averaged 0% over 3 logged steps, reward mean 0.5)" in shown
    assert "Train more steps" not in shown
    run = json.loads((out / "run.json").read_text())
    assert run["dead_groups"]["dead_steps"] == [] and run["dead_groups"]["cause"] is None


def measured(**logs):
    return measured_cause({"reward": 0.0, "frac_reward_zero_std": 1.0, **logs}, "smollm2-135m", ["data/rl"])


def test_the_cause_is_read_from_the_logged_rewards():
    assert measured(**{"rewards/string_match/mean": 0.0, "rewards/overlong_penalty/mean": -1.0}).kind == "too_hard"
    assert measured(**{"rewards/string_match/mean": 1.0}).kind == "too_easy"
    assert "all_pass/ left out" in measured(**{"rewards/string_match/mean": 1.0}).text
    assert measured(**{"rewards/judge/mean": 0.5}).kind == "constant"
    unparsed = measured(**{"rewards/string_match/mean": 0.0, "string_match/unparsed": 1.0})
    assert unparsed.kind == "unparsed" and "fix the extractor" in unparsed.text
    cut = {"rewards/string_match/mean": 0.0, "string_match/unparsed": 1.0, "completions/clipped_ratio": 1.0}
    assert measured(**cut).kind == "cut" and "raise max_completion_length" in measured(**cut).text
    unscored = measured_cause({"reward": None, "rewards/string_match/mean": None, "frac_reward_zero_std": 0.0}, "m", [])
    assert unscored.kind == "unscored" and "answer_column" in unscored.text
    # TRL logs frac_reward_zero_std 0 when no completion scored, yet nothing trains
    assert dead_share({"reward": None, "frac_reward_zero_std": 0.0}) == 1.0
    assert dead_share({"reward": 0.2, "frac_reward_zero_std": 1.0, "dyn/dead_frac_global": 0.0}) == 0.0  # refilled
    assert dead_share({"reward": 0.0, "reward_std": 0.0}) == 1.0  # async GRPO: the mean of its groups' stds
    assert dead_share({"loss": 0.1}) is None


def test_the_closing_note_gives_the_share_of_the_dead_steps():
    live = {"reward": 0.5, "frac_reward_zero_std": 0.5, "rewards/string_match/mean": 0.5}
    dead = {"reward": 0.0, "frac_reward_zero_std": 1.0, "rewards/string_match/mean": 0.0}
    warning, record = closing_note([{"step": 1, **live}, {"step": 2, **dead}], "m", ["d"])
    assert warning.startswith("1 of 2 steps trained nothing: dead groups") and "averaged 75%" in warning
    assert "the last steps were dead: every completion scored 0" in warning
    assert record == {"steps": 2, "dead_steps": [2], "dead_share_mean": 0.75, "reward_mean": 0.25, "cause": "too_hard"}
    assert closing_note([{"step": 1, **live}], "m", ["d"])[0] is None
    assert closing_note([{"step": 1, "loss": 0.3}], "m", ["d"]) == (None, None)
