"""The KL estimators TRL has no switch for (`kl_estimator: k2`, the half squared log-ratio; k1),
added by Rufus's GRPO trainer around TRL's loss. The aggregation is checked against TRL itself:
for TRL's own k3, Rufus's aggregation must reproduce exactly what TRL adds (its loss with beta
minus its loss without); then k2 must add beta x the same aggregation of
0.5 (log pi - log ref)^2. Runs the real trainer with the built-in tiny-random + LoRA on CPU (no
generation: the rollout tensors are made by hand). The recipe run trains the real model: its
rewards must differ inside a group, which random weights never make them."""

from __future__ import annotations

import example_shards
import pytest
import torch
from datasets import Dataset
from train_helpers import one_torch_thread, run_tiny

from rufus_train import modeling
from rufus_train.config import LoraSettings
from rufus_train.grpo.dynamic_sampling import RufusGRPOConfig
from rufus_train.grpo.kl_penalty import aggregate_per_token, importance_weights, per_token_kl
from rufus_train.grpo.trainer import RufusGRPOTrainer

pytestmark = pytest.mark.usefixtures("one_torch_thread")
_ = one_torch_thread
BETA = 0.02


def zero_reward(completions, **kwargs):
    return [0.0] * len(completions)


@pytest.fixture(scope="module")
def trainer(tiny_model, tmp_path_factory):
    model = modeling.apply_lora(modeling.load_model(tiny_model, "float32"), LoraSettings())
    tokenizer = modeling.load_tokenizer(tiny_model)
    dataset = Dataset.from_dict({"prompt": [[{"role": "user", "content": "What is 2 + 2?"}]] * 4})
    args = RufusGRPOConfig(
        output_dir=str(tmp_path_factory.mktemp("kl")), per_device_train_batch_size=4, num_generations=2,
        max_completion_length=6, beta=BETA, learning_rate=1e-4, report_to="none", bf16=False, save_strategy="no",
        gradient_checkpointing=False, dataloader_num_workers=0,
    )
    trainer = RufusGRPOTrainer(model=model, reward_funcs=[zero_reward], args=args, train_dataset=dataset,
                               processing_class=tokenizer)
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 2  # exercise the accumulation normaliser
    return trainer


def rollout(trainer) -> dict:
    """Four rollouts of different lengths, with reference log-probs off the policy's and an old policy."""
    generator = torch.Generator().manual_seed(0)
    prompt_ids = torch.randint(100, 5000, (4, 5), generator=generator)
    completion_ids = torch.randint(100, 5000, (4, 6), generator=generator)
    completion_mask = torch.tensor([[1] * 6, [1] * 4 + [0] * 2, [1] * 3 + [0] * 3, [1] * 6])
    with torch.no_grad():
        logps, _, _ = trainer._get_per_token_logps_and_entropies(
            trainer.model, torch.cat([prompt_ids, completion_ids], 1),
            torch.cat([torch.ones_like(prompt_ids), completion_mask], 1), 6)
    return {
        "prompt_ids": prompt_ids, "prompt_mask": torch.ones_like(prompt_ids),
        "completion_ids": completion_ids, "completion_mask": completion_mask,
        "advantages": torch.tensor([0.5, -0.5, 1.0, -1.0]),
        "ref_per_token_logps": logps + 0.3 * torch.randn(logps.shape, generator=generator),
        "old_per_token_logps": logps + 0.05 * torch.randn(logps.shape, generator=generator),
        "num_items_in_batch": completion_mask.sum(),
    }


def loss_at(trainer, inputs, beta: float, estimator: str) -> torch.Tensor:
    trainer.beta, trainer.args.kl_estimator = beta, estimator
    try:
        with torch.no_grad():
            return trainer._compute_loss(trainer.model, inputs)
    finally:
        trainer.beta, trainer.args.kl_estimator = BETA, "k3"


def rufus_penalty(trainer, inputs, estimator: str) -> torch.Tensor:
    with torch.no_grad():
        logps, _, _ = trainer._get_per_token_logps_and_entropies(
            trainer.model, torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1),
            torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], 1), 6)
    mask = inputs["completion_mask"]
    kl = per_token_kl(logps, inputs["ref_per_token_logps"], estimator)
    weighted = kl * importance_weights(logps, inputs["old_per_token_logps"], mask, "token")
    return BETA * aggregate_per_token(
        weighted, mask, loss_type=trainer.loss_type, num_items_in_batch=inputs["num_items_in_batch"], num_processes=1,
        accumulation_steps=trainer.current_gradient_accumulation_steps,
        steps_per_generation=trainer.args.steps_per_generation, max_completion_length=6, training=True)


@pytest.mark.parametrize("loss_type", ["dapo", "grpo", "bnpo", "dr_grpo"])
def test_rufus_aggregation_reproduces_trls_own_k3_term(trainer, loss_type):
    trainer.loss_type = loss_type
    inputs = rollout(trainer)
    trl_term = loss_at(trainer, inputs, BETA, "k3") - loss_at(trainer, inputs, 0.0, "k3")
    assert trl_term.abs() > 1e-6
    assert trl_term.item() == pytest.approx(rufus_penalty(trainer, inputs, "k3").item(), rel=1e-4)
    trainer.loss_type = "dapo"


def test_kl_estimator_k2_adds_half_the_squared_log_ratio(trainer):
    inputs = rollout(trainer)
    policy_only = loss_at(trainer, inputs, 0.0, "k3")
    with_k2 = loss_at(trainer, inputs, BETA, "k2")
    with_k3 = loss_at(trainer, inputs, BETA, "k3")
    expected = rufus_penalty(trainer, inputs, "k2")
    assert (with_k2 - policy_only).item() == pytest.approx(expected.item(), rel=1e-4)
    assert with_k2.item() != pytest.approx(with_k3.item(), rel=1e-3)  # a different estimator, not TRL's k3
    # the logged kl is the masked mean of k2 itself
    logps = inputs["ref_per_token_logps"]  # any tensor: k2 of equal log-probs is 0
    assert per_token_kl(logps, logps, "k2").abs().max() == 0
    assert trainer._metrics["train"]["kl"][-1] > 0


def test_kl_estimator_k2_carries_a_gradient_to_the_adapter(trainer):
    inputs = rollout(trainer)
    inputs["advantages"] = torch.zeros(4)  # the policy term is 0: any gradient comes from the KL term
    trainer.beta, trainer.args.kl_estimator = BETA, "k2"
    try:
        trainer.model.zero_grad()
        trainer._compute_loss(trainer.model, inputs).backward()
    finally:
        trainer.args.kl_estimator = "k3"
    grads = [p.grad for n, p in trainer.model.named_parameters() if "lora_B" in n]  # A has none while B is 0
    assert grads and any(g is not None and g.abs().max() > 0 for g in grads)


@pytest.mark.model
def test_recipe_grpo_settings_train_two_steps(data_root, tmp_path):
    """Tulu 3's GRPO keys end to end: two inner epochs, k2 with beta 0.02, clip 0.2/0.272, centred advantages."""
    shards = example_shards.calculation_rl(example_shards.gsm8k_calculations(data_root, 4), tmp_path / "rl")
    result = run_tiny(  # the length penalty's soft part (4 to 12 tokens) makes rewards differ inside a group
        "reasoning_rl", shards, tmp_path / "run", per_device_train_batch_size=4, num_generations=2, max_rows=None,
        max_completion_length=12, overlong_cache=8, learning_rate=1e-3, beta=0.02, kl_estimator="k2",
        num_iterations=2, epsilon=0.2, epsilon_high=0.272, adv_norm="centered", max_steps=2,
    )
    args = result.trainer.args
    assert (args.num_iterations, args.beta, args.kl_estimator) == (2, 0.02, "k2")
    assert (args.epsilon, args.epsilon_high, args.scale_rewards) == (0.2, 0.272, "none")
    kls = [m["kl"] for m in result.metrics if "kl" in m]
    assert kls and kls[0] >= 0 and kls[-1] > 0  # the second pass sees a policy that moved off the reference


@pytest.mark.parametrize("number", [0, 1, 2, 3])
def test_a_numbered_kl_estimator_is_refused_with_the_names(number):
    """A number is an index in Open Instruct (2 = k3) and was a name's digit in Rufus (2 = k2): refused,
    the message naming the estimators and Open Instruct's reading of that number."""
    from rufus_data.base.errors import RufusError
    from rufus_train.config_loading import load_stage_config
    from rufus_train.grpo.config import GRPOStageConfig

    with pytest.raises(RufusError) as refused:
        load_stage_config("reasoning_rl", GRPOStageConfig, None, {"kl_estimator": number, "beta": 0.02}, "test {key}")
    message = str(refused.value)
    assert "kl_estimator takes a name: k1, k2, k3" in message
    assert f"Open Instruct's kl_estimator {number} is {['k1', 'k2', 'k3', 'ratio x k1'][number]}" in message


def test_the_named_estimators_are_the_three_formulas():
    policy, ref = torch.tensor([[-1.0, -2.0]]), torch.tensor([[-1.5, -1.0]])
    r = policy - ref
    assert torch.allclose(per_token_kl(policy, ref, "k1"), r)
    assert torch.allclose(per_token_kl(policy, ref, "k2"), r.pow(2) / 2)
    assert torch.allclose(per_token_kl(policy, ref, "k3"), torch.exp(-r) + r - 1)
