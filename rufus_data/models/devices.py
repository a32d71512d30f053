"""Which GPUs each role of a training run uses, for every stage: one settings block (a stage
config's `devices:`), one parser of device strings, one check of the roles against each other,
and the one count of the GPUs this process sees.

The roles are the trainer processes, the vLLM generation server a GRPO stage trains against, and
the checkpoint evaluation. Their ids are physical GPU ids, given verbatim to each role's processes
as CUDA_VISIBLE_DEVICES: rufus_train/launch.py gives the trainer processes theirs, `rufus-train
serve --stage` the server, the checkpoint evaluation (rufus_eval/checkpoint_eval/) its own. The
trainer and the server must not share a GPU (the server pre-allocates most of its GPUs' memory);
evaluation sharing one with either is a loud warning.

It lives below eval and train because both read it: the stage configs hold the block, the
checkpoint evaluation applies and checks its role."""

from __future__ import annotations

import contextlib
import os
import shutil
import warnings

from pydantic import Field

from rufus_data.base.console import console
from rufus_data.base.errors import RufusError
from rufus_data.base.yaml_config import StrictModel

DEFAULT_EVAL_DEVICES = "0,1"  # the checkpoint evaluation's GPUs when evaluation is on and none are given


def gpu_ids(devices: str | None) -> list[str]:
    """The ids of a device string, in order: "0, 1" -> ["0", "1"]; None or "" -> []."""
    return [d.strip() for d in str(devices or "").split(",") if d.strip()]


def gpu_count() -> int:
    """CUDA devices this process can use (0 without nvidia-smi: no driver, no GPU)."""
    if shutil.which("nvidia-smi") is None:
        return 0
    with contextlib.suppress(Exception):  # a broken driver or CUDA build counts as no GPU
        import torch  # heavy: asked only where a GPU driver is installed

        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    return 0


class DeviceRoles(StrictModel):
    """Physical GPU ids (CUDA_VISIBLE_DEVICES style) of each role of a stage's run."""

    trainer: str | None = Field(
        None, description="the trainer processes' GPUs (null: the CUDA_VISIBLE_DEVICES `rufus-train stage` runs with)"
    )
    server: str | None = Field(
        None, description="the vLLM server's GPUs, GRPO stages (`rufus-train serve --stage NAME` starts it on them)"
    )
    eval: str | None = Field(
        None, description=f"the checkpoint evaluation's GPUs (null with eval.eval_on_checkpoint: {DEFAULT_EVAL_DEVICES})"
    )

    def with_evaluation(self) -> DeviceRoles:
        """These roles with checkpoint evaluation on: its GPUs are the default ones when none are
        given, resolved here so that every pair of roles is checked against them."""
        return self if self.eval is not None else self.model_copy(update={"eval": DEFAULT_EVAL_DEVICES})

    def check(self, this_process_trains: bool = True) -> None:
        """Every pair of roles, before anything starts: trainer and server sharing a GPU is an
        error; evaluation sharing one with either is a loud warning; an evaluation role without
        ids is an error. The trainer's GPUs are its role; where none is given and this process
        trains (or launches the trainer), the CUDA_VISIBLE_DEVICES its processes inherit, and for
        the warning, when that is unset too, every GPU this process sees (`rufus-train serve`
        passes `this_process_trains=False`: its own GPUs say nothing about the trainer's)."""
        if self.eval is not None and not gpu_ids(self.eval):
            raise RufusError(
                "checkpoint evaluation is on but devices.eval is empty: give the physical GPU ids the evaluation "
                f"may use (e.g. devices.eval: \"{DEFAULT_EVAL_DEVICES}\"), or turn eval.eval_on_checkpoint off"
            )
        trainer = self.trainer
        if trainer is None and this_process_trains:
            trainer = os.environ.get("CUDA_VISIBLE_DEVICES")
        trainer_ids, server_ids, eval_ids = set(gpu_ids(trainer)), set(gpu_ids(self.server)), set(gpu_ids(self.eval))
        if trainer_ids & server_ids:
            raise RufusError(
                f"GPU {','.join(sorted(trainer_ids & server_ids))} is both a trainer device (CUDA_VISIBLE_DEVICES="
                f"{trainer}) and a vLLM server device ({self.server}): the server pre-allocates most of its GPUs' "
                "memory and the trainer would run out of memory. Give them disjoint devices (e.g. trainer 0, server 1)"
            )
        if trainer is None and this_process_trains:  # nothing says where the trainer runs: every GPU here
            trainer_ids = {str(i) for i in range(gpu_count())}
        for role, ids in (("trainer", trainer_ids), ("vLLM server", server_ids)):
            shared = eval_ids & ids
            if shared:
                message = (
                    f"evaluation devices ({self.eval}) overlap the {role}'s on GPU {','.join(sorted(shared))} "
                    f"(the {role}'s GPUs: {','.join(sorted(ids))}): evaluation will compete for memory and time "
                    "with training; give it its own GPU"
                )
                console.print(f"[bold red]WARNING[/] {message}")
                warnings.warn(message, UserWarning, stacklevel=2)
