"""Dynamic sampling for synchronous GRPO: what to do with prompt groups whose rewards carry no signal.

A group whose completions all earn the same reward has zero advantage everywhere, so it trains
nothing while still costing a forward/backward pass and diluting the loss normaliser. TRL's
GRPOTrainer has no remedy; verl's `filter_groups` and ms-swift's dynamic sampling are the
references for the two modes here:

- `mask`: a micro-batch whose rows are *all* in dead groups contributes nothing (its loss is
  multiplied by zero). Mixed micro-batches are left alone: their dead rows add no policy
  gradient, but still add their KL (`beta`), entropy-bonus and router auxiliary terms, so the
  gradient equals "dead rows removed" only when all three are off (warned at init).
- `resample`: informative groups are kept whole; replacement prompts come from a separate
  sampler (`repeat_count=1`, `seed + 1`), are generated and scored, and informative groups are
  added until the local batch is full or `dynamic_sampling_max_rounds` rounds have run (then the
  batch is topped up with dead groups so its shape holds). The loss normaliser
  (`num_items_in_batch`) is recomputed for the refilled batch. The resample sampler's seed and
  cursor are saved beside each checkpoint, so a resumed run draws the same replacements.

Deadness is decided per group from the gathered rewards, never per row: a row exactly at its
group's mean has advantage 0 inside an informative group and is trained like any other.
Metrics: `dyn/dead_frac` (share of local rows in a dead group, after any refill),
`dyn/dead_frac_global` (the same over every process's rows) and `dyn/refilled` (1 when the refill
filled the batch, 0 on fallback). `dyn/dead_frac` is not TRL's `frac_reward_zero_std`: TRL
measures that before any filtering, per prompt, gathered over ranks, and logs it again for each
refill batch scored. Under async GRPO (which refuses dynamic sampling) a generation group's
samples may train in different optimizer steps, so a step's reward_std and grad_norm need not
match one to one. `resample` trains other prompts than a run without it (the
refills come from a second sampler), so the two runs are not reproductions of each other."""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch
from datasets import IterableDataset
from transformers import ProcessorMixin
from trl import GRPOConfig, GRPOTrainer
from trl.trainer.utils import RepeatSampler

from rufus_data.base.errors import RufusError
from rufus_data.folders.run_folder import DYNAMIC_SAMPLING_STATE, checkpoint_dir
from rufus_data.rewards.groups import teaches_nothing

DYNAMIC_SAMPLING_MODES = ("mask", "resample")
# Output keys of GRPOTrainer._generate_and_score_completions that carry images or token types:
# refused, because merging and masking rows of those is model-specific.
MULTIMODAL_KEYS = (
    "pixel_values",
    "image_grid_thw",
    "pixel_attention_mask",
    "spatial_shapes",
    "image_sizes",
    "token_type_ids",
    "mm_token_type_ids",
    "image_position_ids",
    "num_images",
    "num_tiles",
)


@dataclass
class RufusGRPOConfig(GRPOConfig):
    """GRPOConfig plus the two dynamic-sampling settings and the KL estimator (kl_penalty.py)."""

    kl_estimator: str = field(
        default="k3",
        metadata={"help": "KL estimator with beta > 0: k3 (TRL's), k2 = half the squared log-ratio, k1 = the log-ratio."},
    )

    dynamic_sampling: str | None = field(
        default=None,
        metadata={"help": "What to do with prompt groups whose rewards are all equal: null (train them), 'mask' or 'resample'."},
    )
    dynamic_sampling_max_rounds: int = field(
        default=4,
        metadata={"help": "resample: most refill rounds per generation batch before topping up with dead groups."},
    )


def dead_groups(
    rewards_per_func: torch.Tensor, weights: torch.Tensor, num_generations: int, aggregation: str = "sum_then_normalize"
) -> torch.Tensor:
    """Boolean per group: True when the group's rewards give every one of its rows the same
    advantage (rufus_data.rewards.teaches_nothing, the predicate `rufus-data filter` buckets with).

    `rewards_per_func` is (rows, funcs) with NaN where a function did not apply, rows grouped in
    consecutive runs of `num_generations` (GRPO's layout); `aggregation` is TRL's
    multi_objective_aggregation."""
    rows = rewards_per_func.detach().double().cpu().tolist()
    weight_list = weights.detach().double().cpu().tolist()
    dead = []
    for start in range(0, len(rows), num_generations):
        group = rows[start : start + num_generations]
        per_function = [[row[f] for row in group] for f in range(rewards_per_func.size(1))]
        dead.append(teaches_nothing(per_function, weight_list, aggregation))
    return torch.tensor(dead, dtype=torch.bool, device=rewards_per_func.device)


class ResampleStream:
    """The separate prompt sampler `resample` draws replacement groups from.

    A TRL RepeatSampler over the training set (`repeat_count=1`, seeded with the run's seed + 1),
    re-iterated epoch after epoch. Its position is one integer (groups drawn so far): replaying
    that many draws from the same seed restores it exactly, which is what a resume does."""

    def __init__(self, dataset, num_generations: int, seed: int, groups_drawn: int = 0):
        self.num_generations = num_generations
        self.seed = seed
        self.groups_drawn = 0
        self._sampler = RepeatSampler(
            data_source=dataset, mini_repeat_count=num_generations, batch_size=1, repeat_count=1, shuffle=True, seed=seed
        )
        self._iterator: Iterator[int] = iter(())
        if groups_drawn:
            self.draw(groups_drawn)

    def draw(self, num_groups: int) -> list[int]:
        """Dataset indices of the next `num_groups` groups, each index repeated num_generations times."""
        indices: list[int] = []
        while len(indices) < num_groups * self.num_generations:
            try:
                indices.append(next(self._iterator))
            except StopIteration:  # next epoch: the sampler's generator gives a new permutation
                self._iterator = iter(self._sampler)
        self.groups_drawn += num_groups
        return indices

    def state(self) -> dict:
        return {"seed": self.seed, "groups_drawn": self.groups_drawn}


class EpochSeededRepeatSampler(RepeatSampler):
    """TRL's RepeatSampler plus `set_epoch`: epoch e is shuffled with seed + EPOCH_STRIDE * e.

    transformers calls `set_epoch` on samplers that have it; TRL's has none, so a run resumed in
    a later epoch would replay the first epoch's order. Epoch 0 keeps TRL's order."""

    EPOCH_STRIDE = 7919  # keeps epoch seeds away from the resample sampler's seed + 1

    def set_epoch(self, epoch: int) -> None:
        if self.shuffle and self.seed is not None:
            self.generator.manual_seed(self.seed + self.EPOCH_STRIDE * epoch)


class DynamicSamplingGRPOTrainer(GRPOTrainer):
    """GRPOTrainer with `dynamic_sampling: mask | resample` (see the module docstring).

    With `dynamic_sampling: null` it is TRL's GRPOTrainer, except that the prompt sampler is
    re-seeded per epoch (EpochSeededRepeatSampler), so a resume in any epoch sees the same prompts."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.dynamic_sampling = getattr(self.args, "dynamic_sampling", None)
        self.dynamic_sampling_max_rounds = getattr(self.args, "dynamic_sampling_max_rounds", 4)
        self._last_rewards_per_func: torch.Tensor | None = None
        self._resample_stream: ResampleStream | None = None
        if self.dynamic_sampling is None:
            return
        problems = dynamic_sampling_problems(
            mode=self.dynamic_sampling,
            max_rounds=self.dynamic_sampling_max_rounds,
            train_dataset=self.train_dataset,
            processing_class=self.processing_class,
            local_generation_batch=self.args.per_device_train_batch_size * self.args.steps_per_generation,
            num_generations=self.num_generations,
        )
        if problems:
            raise RufusError("dynamic_sampling cannot run with this configuration:\n- " + "\n- ".join(problems))
        if self.dynamic_sampling == "mask":
            for message in mask_warnings(self.beta, self._entropy_bonus_enabled, self.aux_loss_enabled):
                warnings.warn(message, UserWarning, stacklevel=2)
        else:
            self._resample_stream = ResampleStream(self.train_dataset, self.num_generations, self.args.seed + 1)

    def _get_train_sampler(self, dataset=None):
        dataset = self.train_dataset if dataset is None else dataset
        return EpochSeededRepeatSampler(
            data_source=dataset,
            mini_repeat_count=self.num_generations,
            batch_size=self.args.generation_batch_size // self.num_generations,
            repeat_count=self.num_iterations * self.args.steps_per_generation,
            shuffle=self.shuffle_dataset,
            seed=self.args.seed,
        )

    # --- scoring ------------------------------------------------------------------------------
    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        """Keep the gathered rewards of the batch just scored: deadness is read from them."""
        rewards = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        self._last_rewards_per_func = rewards
        return rewards

    def _score(self, inputs: list[dict]) -> tuple[dict, torch.Tensor]:
        """Generate and score one batch; returns TRL's output and the local rows' dead flags."""
        output = super()._generate_and_score_completions(inputs)
        bad = [key for key in MULTIMODAL_KEYS if key in output]
        if bad:
            raise RufusError(
                f"dynamic_sampling does not support multimodal or token-type inputs (the batch carries {bad}); "
                "set dynamic_sampling: null for this dataset"
            )
        dead = dead_groups(
            self._last_rewards_per_func, self.reward_weights, self.num_generations, self.multi_objective_aggregation
        )
        dead_rows = dead.repeat_interleave(self.num_generations)
        start = self.accelerator.process_index * len(inputs)
        return output, dead_rows[start : start + len(inputs)].to(output["advantages"].device)

    def _generate_and_score_completions(self, inputs):
        if self.dynamic_sampling is None or not self.model.training:
            return super()._generate_and_score_completions(inputs)
        output, dead_rows = self._score(inputs)
        if self.dynamic_sampling == "mask":
            output["dyn_dead"] = dead_rows
            self._log_dead(dead_rows)
            return output
        return self._refill(inputs, output, dead_rows)

    def _refill(self, inputs: list[dict], output: dict, dead_rows: torch.Tensor) -> dict:
        group = self.num_generations
        wanted = len(inputs) // group
        pieces = [(output, dead_rows)]
        informative = [(0, g) for g in range(wanted) if not dead_rows[g * group]]
        rounds = 0
        while True:
            missing = wanted - len(informative)
            # Every process runs the same number of rounds (generation gathers across processes).
            global_missing = int(self.accelerator.gather(torch.tensor([missing], device=dead_rows.device)).max())
            if global_missing == 0 or rounds >= self.dynamic_sampling_max_rounds:
                break
            rounds += 1
            indices = self._resample_stream.draw(global_missing * self.accelerator.num_processes)
            per_process = global_missing * group
            start = self.accelerator.process_index * per_process
            refill_inputs = [self.train_dataset[i] for i in indices[start : start + per_process]]
            refill_output, refill_dead = self._score(refill_inputs)
            pieces.append((refill_output, refill_dead))
            for g in range(global_missing):
                if len(informative) < wanted and not refill_dead[g * group]:
                    informative.append((len(pieces) - 1, g))
        refilled = len(informative) == wanted
        # Fallback: top the batch up with the first batch's dead groups so its shape holds.
        chosen = informative + [(0, g) for g in range(wanted) if dead_rows[g * group]][: wanted - len(informative)]
        merged, merged_dead = self._merge(pieces, chosen)
        self._log_dead(merged_dead)
        self._metrics["train"]["dyn/refilled"].append(float(refilled))
        return merged

    # --- merging refilled groups ----------------------------------------------------------------
    def _merge(self, pieces: list[tuple[dict, torch.Tensor]], chosen: list[tuple[int, int]]) -> tuple[dict, torch.Tensor]:
        """One output dict holding the chosen groups, re-padded to a common width."""
        group = self.num_generations
        rows_by_piece: dict[int, list[int]] = {}
        for piece, g in chosen:
            rows = list(range(g * group, (g + 1) * group))
            rows_by_piece.setdefault(piece, []).extend(rows)
        selected = [(pieces[p][0], pieces[p][1], rows) for p, rows in rows_by_piece.items()]
        pad_id = self._tokenizer.pad_token_id
        padding = {
            "prompt_ids": ("left", pad_id),
            "prompt_mask": ("left", 0),
            "completion_ids": ("right", pad_id),
            "completion_mask": ("right", 0),
            "tool_mask": ("right", 1),
            "old_per_token_logps": ("right", 0.0),
            "ref_per_token_logps": ("right", 0.0),
            "sampling_per_token_logps": ("right", 0.0),
            "importance_sampling_ratio": ("right", 1.0),
        }
        merged: dict = {}
        for key in selected[0][0]:
            if key == "num_items_in_batch":
                continue
            parts = [out[key][torch.tensor(rows, device=out[key].device)] for out, _, rows in selected]
            if key in padding:
                side, pad_value = padding[key]
                merged[key] = _cat_padded(parts, side, pad_value)
            else:  # per-row values: advantages
                merged[key] = torch.cat(parts)
        dead = torch.cat([dead_flags[torch.tensor(rows, device=dead_flags.device)] for _, dead_flags, rows in selected])
        loss_mask = merged["completion_mask"]
        if "tool_mask" in merged:
            loss_mask = loss_mask * merged["tool_mask"]
        merged["num_items_in_batch"] = self.accelerator.gather(loss_mask.sum()).sum()
        return merged, dead

    def _log_dead(self, dead_rows: torch.Tensor) -> None:
        """`dyn/dead_frac`: the share of this process's rows in a dead group (as defined); the
        share over every process's rows as `dyn/dead_frac_global` (the same with one process)."""
        self._metrics["train"]["dyn/dead_frac"].append(dead_rows.float().mean().item())
        self._metrics["train"]["dyn/dead_frac_global"].append(self.accelerator.gather(dead_rows.float()).mean().item())

    # --- loss -------------------------------------------------------------------------------
    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        loss = super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        if self.dynamic_sampling == "mask" and "dyn_dead" in inputs and bool(inputs["dyn_dead"].all()):
            return loss * 0.0  # keeps the graph (every process runs a backward), contributes nothing
        return loss

    # --- checkpoints ------------------------------------------------------------------------
    def _save_checkpoint(self, model, trial):
        super()._save_checkpoint(model, trial)
        if self._resample_stream is not None and self.args.should_save:
            folder = checkpoint_dir(self._get_output_dir(trial=trial), self.state.global_step)
            with open(folder / DYNAMIC_SAMPLING_STATE, "w") as fh:
                json.dump(self._resample_stream.state(), fh)

    def _load_optimizer_and_scheduler(self, checkpoint):
        super()._load_optimizer_and_scheduler(checkpoint)
        if self._resample_stream is None or checkpoint is None:
            return
        path = os.path.join(checkpoint, DYNAMIC_SAMPLING_STATE)
        if not os.path.exists(path):
            warnings.warn(
                f"{path} is missing: the resample sampler restarts from its first draw, so replacement prompts "
                "will differ from the interrupted run",
                UserWarning,
                stacklevel=2,
            )
            return
        with open(path) as fh:
            state = json.load(fh)
        self._resample_stream = ResampleStream(
            self.train_dataset, self.num_generations, state["seed"], groups_drawn=state["groups_drawn"]
        )


def dynamic_sampling_problems(
    *, mode, max_rounds, train_dataset, processing_class, local_generation_batch, num_generations
) -> list[str]:
    """Every reason dynamic sampling cannot run, one message each (empty when it can)."""
    problems = []
    if mode not in DYNAMIC_SAMPLING_MODES:
        problems.append(f"dynamic_sampling must be null, 'mask' or 'resample', got {mode!r}")
        return problems
    if isinstance(processing_class, ProcessorMixin):
        problems.append(
            f"the model's processor ({type(processing_class).__name__}) is multimodal: dynamic_sampling supports "
            "text-only models; set dynamic_sampling: null"
        )
    columns = getattr(train_dataset, "column_names", None) or []
    image_columns = [c for c in ("image", "images") if c in columns]
    if image_columns:
        problems.append(f"the training set has image columns {image_columns}: set dynamic_sampling: null")
    if mode == "resample":
        if isinstance(train_dataset, IterableDataset):
            problems.append(
                "dynamic_sampling: resample draws replacement prompts by index and cannot run on a streaming "
                "dataset: load the shards as a regular dataset or use dynamic_sampling: mask"
            )
        if max_rounds < 1:
            problems.append(f"dynamic_sampling_max_rounds must be >= 1, got {max_rounds}")
        if local_generation_batch % num_generations:
            problems.append(
                f"dynamic_sampling: resample keeps prompt groups whole on each process, so the local generation batch "
                f"(per_device_train_batch_size x steps_per_generation = {local_generation_batch}) must be a multiple "
                f"of num_generations ({num_generations})"
            )
    return problems


def mask_warnings(beta: float, entropy_bonus: bool, router_aux_loss: bool) -> list[str]:
    """Why `mask` may still let dead rows move the weights (one warning per active term)."""
    tail = (
        "dynamic_sampling: mask drops only micro-batches whose rows are all dead; in mixed micro-batches dead rows "
        "still add this term, so the gradient is not that of training without them (use resample, or turn it off)"
    )
    messages = []
    if beta != 0.0:
        messages.append(f"beta={beta} (KL to the reference): {tail}")
    if entropy_bonus:
        messages.append(f"the entropy bonus is on (entropy_coef / use_adaptive_entropy): {tail}")
    if router_aux_loss:
        messages.append(f"the router auxiliary loss is on (router_aux_loss_coef): {tail}")
    return messages


def _cat_padded(parts: list[torch.Tensor], side: str, pad_value) -> torch.Tensor:
    """Concatenate (B_i, T_i) tensors along the batch, padding each to the widest T on one side."""
    if parts[0].dim() == 1:
        return torch.cat(parts)
    width = max(part.size(1) for part in parts)
    padded = []
    for part in parts:
        extra = width - part.size(1)
        if extra:
            fill = part.new_full((part.size(0), extra), pad_value)
            part = torch.cat([fill, part] if side == "left" else [part, fill], dim=1)
        padded.append(part)
    return torch.cat(padded)
