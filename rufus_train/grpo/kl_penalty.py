"""The KL penalty of GRPO with the estimator a recipe names (`kl_estimator`), which TRL has no
switch for: TRL 1.16's GRPOTrainer always adds k3 (`exp(r) - r - 1`, r = ref - policy log-prob)
inside `_compute_loss`. Rufus names the estimators (Schulman's names), never numbers them:

    k1: log pi - log ref                      (unbiased, high variance)
    k2: (log pi - log ref)^2 / 2
    k3: exp(ref - pi) - (ref - pi) - 1        (TRL's own)

A number means different things in different sources: Open Instruct's `kl_estimator` is an index
into [k1, k2, k3, ratio x k1], so the Tulu 3 mini notebook's `kl_estimator: 2` is k3. An integer is
refused with a message saying so (`estimator_name`).

With k1 or k2 the trainer runs TRL's loss with beta set to 0 (the clipped policy term
alone, nothing of k3), catches the policy's per-token log-probs TRL computed on the way, and adds
`beta x estimator` aggregated exactly as TRL aggregates its per-token loss for the run's
`loss_type` (the same mask, tool tokens excluded, the same normaliser), multiplied by the
importance ratio when `use_bias_correction_kl` is on, as TRL does for k3. The reference log-probs
are the ones TRL computed at generation time (the adapter switched off with LoRA). With k3 nothing
changes: TRL computes it.

torch is imported where the tensors are: the GRPO stages check `kl_estimator_problems` while
their configs load, before any model (and torch) does."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rufus_data.base.errors import RufusError

if TYPE_CHECKING:
    import torch

KL_ESTIMATORS = ("k1", "k2", "k3")
# Open Instruct's `kl_estimator` indexes this list (open_instruct/model_utils.py estimate_kl)
OPEN_INSTRUCT_ESTIMATORS = ("k1", "k2", "k3", "ratio x k1")
# loss types whose aggregation `aggregate_per_token` mirrors (TRL 1.16 GRPOTrainer._compute_loss)
AGGREGATED_LOSS_TYPES = ("grpo", "sapo", "bnpo", "dr_grpo", "dapo", "cispo", "vespo", "luspo")


def estimator_name(value: object) -> object:
    """A config's `kl_estimator` as written; an integer (an index in one source, a name's digit in
    another) is refused with the names and Open Instruct's reading of it."""
    if isinstance(value, bool) or not isinstance(value, int):
        return value
    reading = (f"Open Instruct's kl_estimator {value} is {OPEN_INSTRUCT_ESTIMATORS[value]} (an index into "
               f"[{', '.join(OPEN_INSTRUCT_ESTIMATORS)}])" if 0 <= value < len(OPEN_INSTRUCT_ESTIMATORS) else
               "Open Instruct's kl_estimator is an index 0-3 into [k1, k2, k3, ratio x k1]")
    raise ValueError(f"kl_estimator takes a name: {', '.join(KL_ESTIMATORS)}, not the number {value}. A number means "
                     f"different things in different sources ({reading}): write the name of the estimator your "
                     "recipe uses (k1 = the log-ratio, k2 = half its square, k3 = exp(-r) + r - 1, TRL's)")


def per_token_kl(per_token_logps: torch.Tensor, ref_per_token_logps: torch.Tensor, estimator: str) -> torch.Tensor:
    """The per-token estimate of KL(policy || reference) from samples of the policy."""
    import torch  # heavy: see the module's docstring

    log_ratio = per_token_logps - ref_per_token_logps
    if estimator == "k1":
        return log_ratio
    if estimator == "k2":
        return 0.5 * log_ratio.pow(2)
    if estimator == "k3":
        return torch.exp(-log_ratio) + log_ratio - 1
    raise RufusError(f"kl_estimator must be one of {KL_ESTIMATORS}, got {estimator!r}")


def aggregate_per_token(
    values: torch.Tensor, mask: torch.Tensor, *, loss_type: str, num_items_in_batch: torch.Tensor | None,
    num_processes: int, accumulation_steps: int, steps_per_generation: int, max_completion_length: int,
    training: bool,
) -> torch.Tensor:
    """`values` (B, T) reduced to the loss scalar the way TRL reduces its per-token loss."""
    accumulation = accumulation_steps if training else 1.0
    if loss_type in ("grpo", "sapo"):
        return ((values * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).mean() / accumulation
    if loss_type == "bnpo":
        return (values * mask).sum() / mask.sum().clamp(min=1.0) / accumulation
    if loss_type == "dr_grpo":
        return (values * mask).sum() / (values.size(0) * max_completion_length) / accumulation
    if loss_type in ("dapo", "cispo", "vespo"):
        normaliser = num_items_in_batch.clamp(min=1.0) / num_processes
        if training:
            normaliser = normaliser * accumulation_steps / steps_per_generation
        return (values * mask).sum() / normaliser
    if loss_type == "luspo":
        return (values * mask).sum(-1).mean() / accumulation
    raise RufusError(f"kl_estimator k1 or k2 supports loss_type {', '.join(AGGREGATED_LOSS_TYPES)}; got {loss_type!r}")


def importance_weights(per_token_logps: torch.Tensor, old_per_token_logps: torch.Tensor | None, mask: torch.Tensor,
                       level: str) -> torch.Tensor:
    """TRL's coef_1: exp(policy - old) per token, or its masked mean per sequence."""
    import torch  # heavy: see the module's docstring

    old = per_token_logps.detach() if old_per_token_logps is None else old_per_token_logps
    log_ratio = per_token_logps - old
    if level == "sequence":
        log_ratio = ((log_ratio * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).unsqueeze(-1)
    return torch.exp(log_ratio)


class KLEstimatorMixin:
    """Goes before TRL's GRPOTrainer in the bases: swaps TRL's k3 for `args.kl_estimator` k1 or k2."""

    _catch_logps = False
    _caught_logps: torch.Tensor | None = None

    def _get_per_token_logps_and_entropies(self, model, *args, **kwargs):
        out = super()._get_per_token_logps_and_entropies(model, *args, **kwargs)
        if self._catch_logps:
            self._caught_logps = out[0]
        return out

    def _compute_loss(self, model, inputs):
        import torch  # heavy: see the module's docstring

        estimator = getattr(self.args, "kl_estimator", "k3")
        if self.beta == 0.0 or estimator == "k3":
            return super()._compute_loss(model, inputs)
        beta = self.beta
        self.beta, self._catch_logps = 0.0, True  # TRL's loss without its k3 term
        try:
            loss = super()._compute_loss(model, inputs)
        finally:
            self.beta, self._catch_logps = beta, False
        logps, self._caught_logps = self._caught_logps, None
        mask = inputs["completion_mask"]
        if "tool_mask" in inputs:
            mask = mask * inputs["tool_mask"]
        kl = per_token_kl(logps, inputs["ref_per_token_logps"], estimator)
        penalty = kl
        if self.args.use_bias_correction_kl:
            penalty = kl * importance_weights(logps, inputs.get("old_per_token_logps"), mask,
                                              self.importance_sampling_level)
        training = self.model.training
        loss = loss + beta * aggregate_per_token(
            penalty, mask, loss_type=self.loss_type, num_items_in_batch=inputs.get("num_items_in_batch"),
            num_processes=self.accelerator.num_processes, accumulation_steps=self.current_gradient_accumulation_steps,
            steps_per_generation=self.args.steps_per_generation, max_completion_length=self.max_completion_length,
            training=training,
        )
        totals = self.accelerator.reduce(torch.stack([(kl.detach() * mask).sum(), mask.sum().float()]), reduction="sum")
        self._metrics["train" if training else "eval"]["kl"].append((totals[0] / totals[1].clamp(min=1.0)).item())
        return loss


def kl_estimator_problems(config) -> list[str]:
    """What the estimator cannot run with, before anything loads (a GRPO stage config)."""
    problems = []
    if config.kl_estimator == "k3" or config.beta == 0.0:
        return problems
    loss_type = (config.trainer or {}).get("loss_type", "dapo")
    if loss_type not in AGGREGATED_LOSS_TYPES:
        problems.append(f"kl_estimator {config.kl_estimator} is added the way TRL aggregates loss types "
                        f"{', '.join(AGGREGATED_LOSS_TYPES)}; trainer.loss_type is {loss_type!r}: use kl_estimator k3")
    if (config.trainer or {}).get("use_liger_kernel"):
        problems.append(f"kl_estimator {config.kl_estimator} replaces TRL's loss, which the Liger kernel computes "
                        "elsewhere: drop trainer.use_liger_kernel or use kl_estimator k3")
    return problems
