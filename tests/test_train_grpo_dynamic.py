"""Dynamic sampling on a reward that makes known groups dead: prompts marked `[flat]` earn the
same reward for every completion; the others earn 0, 1, ... by position in their group, so every
group's fate is known before generation. Runs the real GRPOTrainer subclass with the built-in
tiny-random + LoRA on CPU (8 completion tokens, 2 generations): the rewards do not read the text."""

from __future__ import annotations

import warnings

import pytest
import torch
from datasets import Dataset

from rufus_train import modeling
from rufus_train.config import LoraSettings
from rufus_train.grpo.dynamic_sampling import DynamicSamplingGRPOTrainer, RufusGRPOConfig

G = 2


class FlatOrRanked:
    """Reward: `[flat]` prompts -> 0.0 for all; others -> position in the group (0, 1, ...).
    Records (global_step, prompt texts) of every scored batch."""

    __name__ = "flat_or_ranked"

    def __init__(self):
        self.calls: list[tuple[int, list[str]]] = []

    def __call__(self, prompts, completions, trainer_state=None, **kwargs):
        texts = [p[-1]["content"] for p in prompts]
        self.calls.append((trainer_state.global_step if trainer_state else -1, texts))
        return [0.0 if "[flat]" in t else float(i % G) for i, t in enumerate(texts)]


def prompts_dataset(flat: int, live: int) -> Dataset:
    texts = [f"[flat] What is {i} + 1?" for i in range(flat)] + [f"What is {i} + 2?" for i in range(live)]
    return Dataset.from_dict({"prompt": [[{"role": "user", "content": t}] for t in texts]})


def make_trainer(model_path, tmp_path, dataset, reward, **overrides):
    model = modeling.apply_lora(modeling.load_model(model_path, "float32"), LoraSettings())
    tokenizer = modeling.load_tokenizer(model_path)
    settings = {
        "output_dir": str(tmp_path), "per_device_train_batch_size": 4, "num_generations": G, "max_completion_length": 8,
        "learning_rate": 1e-4, "max_steps": 2, "logging_steps": 1, "save_strategy": "no", "report_to": "none", "bf16": False,
        "gradient_checkpointing": False, "seed": 7, "dataloader_num_workers": 0,
    }
    settings.update(overrides)
    return DynamicSamplingGRPOTrainer(
        model=model, reward_funcs=[reward], args=RufusGRPOConfig(**settings), train_dataset=dataset,
        processing_class=tokenizer,
    )


def batch_of(dataset: Dataset, indices: list[int]) -> list[dict]:
    return [dataset[i] for i in indices for _ in range(G)]


def test_resample_replaces_dead_groups_and_recomputes_normaliser(tiny_model, tmp_path):
    dataset = prompts_dataset(flat=4, live=8)
    reward = FlatOrRanked()
    trainer = make_trainer(tiny_model, tmp_path, dataset, reward, dynamic_sampling="resample")
    trainer.model.train()
    inputs = batch_of(dataset, [0, 4])  # one dead group, one informative group
    output = trainer._generate_and_score_completions(inputs)

    # first call: the batch as sampled; later calls: replacements drawn from the seed+1 sampler
    assert reward.calls[0][1] == [dataset[0]["prompt"][0]["content"]] * G + [dataset[4]["prompt"][0]["content"]] * G
    assert len(reward.calls) >= 2
    refill_prompts = [t for _, texts in reward.calls[1:] for t in texts]
    assert output["advantages"].shape == (4,) and output["completion_ids"].shape[0] == 4
    # the dead group was replaced by an informative one: every group has one negative and one positive advantage
    pairs = output["advantages"].view(-1, G)
    assert (pairs[:, 0] < 0).all() and (pairs[:, 1] > 0).all()
    assert any("[flat]" not in t for t in refill_prompts)
    # the loss normaliser counts the refilled batch's completion tokens
    assert output["num_items_in_batch"].item() == output["completion_mask"].sum().item()
    metrics = trainer._metrics["train"]
    assert metrics["dyn/dead_frac"][-1] == 0.0 and metrics["dyn/refilled"][-1] == 1.0
    assert trainer._resample_stream.groups_drawn >= 1


def test_resample_falls_back_to_dead_groups_after_max_rounds(tiny_model, tmp_path):
    dataset = prompts_dataset(flat=6, live=0)  # nothing to refill with
    reward = FlatOrRanked()
    trainer = make_trainer(
        tiny_model, tmp_path, dataset, reward, dynamic_sampling="resample", dynamic_sampling_max_rounds=1
    )
    trainer.model.train()
    output = trainer._generate_and_score_completions(batch_of(dataset, [0, 1]))
    assert len(reward.calls) == 2  # the batch, then exactly one refill round
    assert output["advantages"].shape == (4,) and torch.all(output["advantages"] == 0)
    metrics = trainer._metrics["train"]
    assert metrics["dyn/refilled"][-1] == 0.0 and metrics["dyn/dead_frac"][-1] == 1.0


def test_mask_warns_and_zeroes_only_all_dead_micro_batches(tiny_model, tmp_path):
    dataset = prompts_dataset(flat=4, live=4)
    with pytest.warns(UserWarning, match="entropy bonus"):
        trainer = make_trainer(tiny_model, tmp_path, dataset, FlatOrRanked(), dynamic_sampling="mask",
                               entropy_coef=0.5)
    trainer.model.train()
    output = trainer._generate_and_score_completions(batch_of(dataset, [0, 5]))
    assert output["dyn_dead"].tolist() == [True] * G + [False] * G  # decided per group, not per row
    assert trainer._metrics["train"]["dyn/dead_frac"][-1] == 0.5

    trainer.current_gradient_accumulation_steps = 1  # set by the training loop; one micro-batch here
    dead_half = {k: (v[:G] if isinstance(v, torch.Tensor) and v.dim() > 0 else v) for k, v in output.items()}
    live_half = {k: (v[G:] if isinstance(v, torch.Tensor) and v.dim() > 0 else v) for k, v in output.items()}
    dead_loss = trainer.compute_loss(trainer.model, dead_half)
    live_loss = trainer.compute_loss(trainer.model, live_half)
    assert dead_loss.item() == 0.0 and dead_loss.requires_grad  # all rows dead: no contribution, graph kept
    assert live_loss.item() != 0.0  # the entropy bonus (and the policy term) still act on informative rows
    dead_half["dyn_dead"] = torch.zeros(G, dtype=torch.bool)
    assert trainer.compute_loss(trainer.model, dead_half).item() != 0.0  # without the mask, the bonus acts on dead rows


def test_dead_frac_is_over_local_rows_and_the_gathered_share_has_its_own_name(tiny_model, tmp_path, monkeypatch):
    """`dyn/dead_frac` is the share of this process's rows in a dead group (as docs/train_rl.md
    defines it); `dyn/dead_frac_global` is over every process's rows. With one process they agree;
    a second rank whose rows are all informative (its flags appended by the gather, the collective
    standing in for a 2-process group) moves only the gathered figure."""
    dataset = prompts_dataset(flat=4, live=4)
    trainer = make_trainer(tiny_model, tmp_path, dataset, FlatOrRanked(), dynamic_sampling="mask")
    trainer.model.train()
    trainer._generate_and_score_completions(batch_of(dataset, [0, 5]))
    metrics = trainer._metrics["train"]
    assert metrics["dyn/dead_frac"][-1] == metrics["dyn/dead_frac_global"][-1] == 0.5
    other_rank_live = lambda flags: torch.cat([flags, torch.zeros_like(flags)])
    monkeypatch.setattr(trainer.accelerator, "gather", other_rank_live)
    trainer._log_dead(torch.tensor([True] * G + [False] * G))
    assert (metrics["dyn/dead_frac"][-1], metrics["dyn/dead_frac_global"][-1]) == (0.5, 0.25)


def test_dead_frac_is_not_trls_frac_reward_zero_std(tiny_model, tmp_path):
    """The seed's caveat (000): `dyn/dead_frac` is the share of local rows in a dead group *after*
    any refill; TRL's `frac_reward_zero_std` is measured before it, per prompt, over every batch
    scored (the refills included). One dead and one live group, refilled: the first batch's
    zero-std share is 0.5 while the batch that trains has no dead row."""
    dataset = prompts_dataset(flat=4, live=8)
    trainer = make_trainer(tiny_model, tmp_path, dataset, FlatOrRanked(), dynamic_sampling="resample")
    trainer.model.train()
    trainer._generate_and_score_completions(batch_of(dataset, [0, 4]))
    metrics = trainer._metrics["train"]
    assert metrics["frac_reward_zero_std"][0] == 0.5  # the batch as sampled, before the refill
    assert metrics["dyn/dead_frac"][-1] == 0.0 and metrics["dyn/refilled"][-1] == 1.0
    assert len(metrics["frac_reward_zero_std"]) >= 2  # logged again for each refill batch scored


def test_mask_warns_for_beta_but_not_when_gradient_is_untouched(tiny_model, tmp_path):
    dataset = prompts_dataset(flat=2, live=2)
    for beta, expect_warning in ((0.04, True), (0.0, False)):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            make_trainer(tiny_model, tmp_path, dataset, FlatOrRanked(), dynamic_sampling="mask", beta=beta)
        assert any(f"beta={beta}" in str(w.message) for w in caught) == expect_warning


def test_refusals(tiny_model, tmp_path):
    from rufus_data.base.errors import RufusError

    dataset = prompts_dataset(flat=2, live=2)
    streaming = dataset.to_iterable_dataset()
    with pytest.raises(RufusError, match="streaming dataset"):
        make_trainer(tiny_model, tmp_path, streaming, FlatOrRanked(), dynamic_sampling="resample")
    with_images = dataset.add_column("image", [None] * len(dataset))
    with pytest.raises(RufusError, match="image columns"):
        make_trainer(tiny_model, tmp_path, with_images, FlatOrRanked(), dynamic_sampling="mask")
