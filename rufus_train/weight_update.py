"""How far a run moved its weights, and a warning at the end of training when it barely did.

Two GRPO steps can change the merged weights by about 4e-6 while the run reports success: every
answer of the trained model is then byte-identical to the base's. The run says so itself, with
the numbers, in the console and in run.json (`weight_update`).

The measure is ||dW|| / ||W|| over the trained matrices: for LoRA, dW is each adapted layer's
delta (scale x B @ A, what a merge adds) against that layer's base weight; for full fine-tuning,
the change of a fixed strided sample of the trainable weights (at most SAMPLE_ELEMENTS, so a
large model is not copied whole)."""

from __future__ import annotations

import math

# A run "barely moved" its weights below bf16's relative resolution (2^-8, about 4e-3): a bf16
# copy of such a model (vLLM, a bf16 merge) rounds most of the update away.
BARELY_MOVED = 2.0**-8
SAMPLE_ELEMENTS = 4_000_000


def weight_sample(model) -> dict:
    """Before training (full fine-tuning): a strided copy of the trainable weights."""
    params = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
    total = sum(p.numel() for _, p in params)
    stride = max(1, math.ceil(total / SAMPLE_ELEMENTS))
    return {name: p.detach().flatten()[::stride].float().clone() for name, p in params}


def lora_update(model) -> tuple[float, float, float]:
    """(sum of squares of the adapters' deltas, of their base weights, largest |delta|) over every
    LoRA layer's trainable adapter (a frozen reference adapter, as DPO keeps, is left out)."""
    from peft.tuners.lora import LoraLayer  # heavy: peft loads only with a model

    delta_sq = base_sq = largest = 0.0
    for module in model.modules():
        if not isinstance(module, LoraLayer):
            continue
        for name in module.active_adapters:
            if name not in module.lora_A or not module.lora_A[name].weight.requires_grad:
                continue
            delta = module.get_delta_weight(name).detach().float()
            base = module.get_base_layer().weight.detach().float()
            delta_sq += float(delta.pow(2).sum())
            base_sq += float(base.pow(2).sum())
            largest = max(largest, float(delta.abs().max()))
    return delta_sq, base_sq, largest


def sample_update(model, before: dict) -> tuple[float, float, float]:
    """The same sums for full fine-tuning, on the sample `weight_sample` took."""
    now = weight_sample(model) if before else {}
    delta_sq = base_sq = largest = 0.0
    for name, old in before.items():
        delta = now[name] - old
        delta_sq += float(delta.pow(2).sum())
        base_sq += float(old.pow(2).sum())
        largest = max(largest, float(delta.abs().max()) if delta.numel() else 0.0)
    return delta_sq, base_sq, largest


def measure(model, lora: bool, before: dict | None = None) -> dict:
    """{relative, max_abs}: how far training moved the weights (see the module docstring)."""
    delta_sq, base_sq, largest = lora_update(model) if lora else sample_update(model, before or {})
    relative = math.sqrt(delta_sq / base_sq) if base_sq else 0.0
    return {"relative": float(f"{relative:.3g}"), "max_abs": float(f"{largest:.3g}")}


def barely_moved_warning(update: dict, metrics: list[dict], steps: int, signal: dict | None = None) -> str | None:
    """The end-of-training warning, or None: weights moved less than BARELY_MOVED relative to
    their size, or loss and grad norm were 0 at every logged step. `signal`: a GRPO run's measured
    rewards (run.json's `dead_groups`, from rufus_train/grpo/dead_groups.py), which replace the
    advice: its groups carried signal, so the steps and learning rate are what moved so little."""
    logged = [m for m in metrics if "loss" in m or "grad_norm" in m]
    flat = bool(logged) and all(not m.get("loss") and not m.get("grad_norm") for m in logged)
    if flat:
        return (f"loss and grad norm were 0 at every logged step ({len(logged)} logs over {steps} steps): nothing "
                "was learned")
    if update["relative"] >= BARELY_MOVED:
        return None
    moved = (f"the weights barely moved: ||dW||/||W|| = {update['relative']:.2g}, largest change "
             f"{update['max_abs']:.2g}, after {steps} steps - below bf16's resolution (about 4e-3 of a weight), so a "
             "bf16 copy of this model (vLLM, a bf16 merge) is nearly the base model, and its answers will hardly "
             "differ from the base's")
    if signal:
        reward = "-" if signal.get("reward_mean") is None else f"{signal['reward_mean']:.4g}"
        return (f"{moved}. Measured: no step's groups were all dead (dead groups averaged "
                f"{signal['dead_share_mean']:.0%} over {signal['steps']} logged steps, reward mean {reward}), so the "
                "rewards carried signal and this many steps at this learning rate moved the weights that little")
    return f"{moved}. Train more steps or with a higher learning rate"
