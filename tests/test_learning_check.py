"""The stages visibly learn (opt-in: about 15 minutes on a 2-core CPU): bench/learning_check.py
trains sft, dpo and reasoning_rl from the built-in model on one-step arithmetic from GSM8K's
calculator annotations (numbers up to 25) and measures 64 held-out items before and after each."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from conftest import REPO


@pytest.mark.slow
@pytest.mark.spawn
def test_sft_dpo_and_reasoning_rl_learn_within_15_minutes(tmp_path):
    proc = subprocess.run(
        [sys.executable, "bench/learning_check.py", "--work", str(tmp_path)], cwd=REPO, check=False,
        env={**os.environ, "OMP_WAIT_POLICY": "PASSIVE"}, capture_output=True, text=True, timeout=30 * 60,
    )
    report = json.loads((tmp_path / "learning_check.json").read_text())
    before, after = report["before"], report["after"]
    assert after["sft_loss"] < before["sft_loss"], report
    assert after["dpo_accuracy"] > before["dpo_accuracy"], report
    assert report["rl_last5"] - report["rl_first5"] >= 0.15, report["rl_rewards"]
    assert after["rl_accuracy"] - before["rl_accuracy"] >= 0.10 - 1e-9, report
    assert report["total_s"] <= 15 * 60, report["total_s"]
    assert proc.returncode == 0 and (tmp_path / "learning_check.png").stat().st_size > 0, proc.stdout[-2000:]
