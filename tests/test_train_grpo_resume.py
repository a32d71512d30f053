"""Resuming synchronous GRPO with `dynamic_sampling: resample` is exact: the resumed run trains
the same prompts, in the same order (refills included), as the uninterrupted run. The resample
sampler's seed and cursor ride in the checkpoint (dynamic_sampling_state.json); the main
sampler is re-seeded per epoch, so resuming across an epoch boundary works too. The resumed run
starts as one on a new machine does: `latest` restores the checkpoint from the mirror
(`checkpoint_mirror`), which received every complete checkpoint of the first run."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from test_train_grpo_dynamic import FlatOrRanked, make_trainer, prompts_dataset

from rufus_train.checkpoints import LATEST, CompleteCheckpoints
from rufus_train.mirror import Mirror
from rufus_train.resume import resume_checkpoint


def scored_from(calls, step):
    return [(s, texts) for s, texts in calls if s >= step]


def check_resume(tiny_model, tmp_path, steps: int, resume_at: int, flat: int, live: int):
    dataset = prompts_dataset(flat=flat, live=live)
    settings = {"dynamic_sampling": "resample", "max_steps": steps, "save_strategy": "steps", "save_steps": resume_at,
                    "dynamic_sampling_max_rounds": 2}
    straight = FlatOrRanked()
    trainer = make_trainer(tiny_model, tmp_path / "straight", dataset, straight, **settings)
    mirror = tmp_path / "mirror"
    trainer.add_callback(CompleteCheckpoints(Mirror(str(mirror))))
    trainer.train()

    checkpoint = tmp_path / "straight" / f"checkpoint-{resume_at}"
    state = json.loads((checkpoint / "dynamic_sampling_state.json").read_text())
    assert state["seed"] == 7 + 1 and state["groups_drawn"] > 0  # refills happened before the checkpoint
    for later in mirror.glob("checkpoint-*"):  # preempted before they reached the mirror
        if int(later.name.removeprefix("checkpoint-")) > resume_at:
            shutil.rmtree(later)
    restored = resume_checkpoint(LATEST, tmp_path / "resumed", str(mirror))  # a new machine: nothing local
    assert restored == str(tmp_path / "resumed" / f"checkpoint-{resume_at}")
    assert (Path(restored) / "dynamic_sampling_state.json").read_text() == json.dumps(state)

    resumed = FlatOrRanked()
    trainer = make_trainer(tiny_model, tmp_path / "resumed", dataset, resumed, **settings)
    trainer.train(resume_from_checkpoint=restored)
    assert trainer.state.global_step == steps
    expected = scored_from(straight.calls, resume_at)
    assert expected, "the uninterrupted run scored nothing after the checkpoint"
    assert scored_from(resumed.calls, resume_at) == expected
    assert trainer._resample_stream.groups_drawn == groups_refilled(straight.calls)


def groups_refilled(calls) -> int:
    """Groups the resample stream drew: the batches scored after the first one of the same step."""
    return sum(len(texts) // 2 for i, (step, texts) in enumerate(calls) if i and calls[i - 1][0] == step)


@pytest.mark.train
def test_resume_resample_fast(tiny_model, tmp_path):
    """3 steps over 4 prompts (2 per step: an epoch boundary at the checkpoint), resumed from checkpoint-2."""
    check_resume(tiny_model, tmp_path, steps=3, resume_at=2, flat=2, live=2)


@pytest.mark.slow
def test_resume_resample_twelve_steps(tiny_model, tmp_path):
    """The issue's case: 12 steps, resumed from checkpoint-6, steps 7-12 identical."""
    check_resume(tiny_model, tmp_path, steps=12, resume_at=6, flat=4, live=4)
