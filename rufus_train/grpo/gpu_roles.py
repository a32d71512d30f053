"""Which GPUs each role of a GRPO run uses: the trainer and the vLLM server must not share one
(the server pre-allocates most of its GPUs' memory); evaluation sharing one is a loud warning.
The ids are applied, not only checked: rufus_train/launch.py gives the trainer processes theirs,
`rufus-train serve --stage` the server, and the checkpoint-eval callback the evaluation."""

from __future__ import annotations

import warnings

from rufus_data.console import console
from rufus_data.errors import RufusError


def parse_devices(value: str | None) -> set[str]:
    return {d.strip() for d in str(value or "").split(",") if d.strip()}


def check_gpu_roles(
    trainer: str | None, server: str | None, evaluation: str | None = None, eval_vs_trainer: bool = True
) -> None:
    """Every pair of roles: trainer and vLLM server must not share a GPU (error); evaluation sharing
    one with either is a loud warning. `eval_vs_trainer=False` leaves that pair to the checkpoint
    evaluation callback, which warns about it itself (rufus_eval/callback.py)."""
    trainer_ids, server_ids, eval_ids = parse_devices(trainer), parse_devices(server), parse_devices(evaluation)
    if trainer_ids & server_ids:
        raise RufusError(
            f"GPU {','.join(sorted(trainer_ids & server_ids))} is both a trainer device (CUDA_VISIBLE_DEVICES="
            f"{trainer}) and a vLLM server device ({server}): the server pre-allocates most of its GPUs' memory and "
            "the trainer would run out of memory. Give them disjoint devices (e.g. trainer 0, server 1)"
        )
    for role, ids in (("trainer", trainer_ids if eval_vs_trainer else set()), ("vLLM server", server_ids)):
        shared = eval_ids & ids
        if shared:
            message = (
                f"evaluation devices ({evaluation}) overlap the {role}'s on GPU {','.join(sorted(shared))}: evaluation "
                "will compete for memory and time with training; give it its own GPU"
            )
            console.print(f"[bold red]WARNING[/] {message}")
            warnings.warn(message, UserWarning, stacklevel=2)
