"""Rufus's synchronous GRPO trainer: TRL's GRPOTrainer with dynamic sampling
(dynamic_sampling.py) and the KL estimator a recipe names (kl_penalty.py). Its config is
`RufusGRPOConfig` (dynamic_sampling.py), which the `trainer:` block of a GRPO stage is checked
against."""

from __future__ import annotations

from rufus_train.grpo.dynamic_sampling import DynamicSamplingGRPOTrainer
from rufus_train.grpo.kl_penalty import KLEstimatorMixin


class RufusGRPOTrainer(KLEstimatorMixin, DynamicSamplingGRPOTrainer):
    """GRPOTrainer + `dynamic_sampling: mask | resample` + `kl_estimator: k1 | k2 | k3`."""
