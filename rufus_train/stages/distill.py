"""`distill`: on-policy distillation (TRL's DistillationTrainer). The student samples
completions for each prompt; the loss is the mean per-token divergence (nats) between the
student's and the teacher's next-token distributions on those completions.

`beta` selects the divergence, following TRL's generalised Jensen-Shannon formula
(trl/kernels/chunked_divergence.py):

    beta = 1.0   reverse KL(student || teacher)   mode-seeking (the default)
    beta = 0.0   forward KL(teacher || student)   mass-covering
    0 < beta < 1 generalised JSD: beta * KL(teacher || m) + (1 - beta) * KL(student || m),
                 with the mixture m = (1 - beta) * student + beta * teacher; 0.5 is the standard JSD.

The interior values are not a blend of the two KLs: as beta -> 1 (or -> 0) the mixture collapses
onto one distribution and the interior loss goes to 0, while beta = 1.0 (0.0) itself switches to
the full reverse (forward) KL. So the loss is discontinuous at both ends; do not read 0.9 as
"mostly reverse KL"."""

from __future__ import annotations

from typing import Any, ClassVar

import pyarrow as pa
from pydantic import Field

from rufus_data.base.errors import RufusError
from rufus_train.config import StageConfig
from rufus_train.stage_base import Stage, StageContext, conversational


class DistillStageConfig(StageConfig):
    """On-policy distillation: full 1e-6 (TRL's default), LoRA 1e-5."""

    full_ft_learning_rate: ClassVar[float] = 1e-6
    lora_learning_rate: ClassVar[float] = 1e-5
    trl_config: ClassVar[str] = "trl.DistillationConfig"
    max_length_unused_because: ClassVar[str | None] = (
        "TRL's DistillationConfig has no such field; the student samples at most max_completion_length tokens "
        "after each prompt, and that is the sequence both models score"
    )

    max_length: int | None = Field(None, description="not used by distill: refused (see max_length_unused_because)")
    teacher: str | None = Field(None, description="teacher model reference (same tokenizer vocabulary as the student)")
    beta: float = Field(1.0, ge=0.0, le=1.0, description="1.0 reverse KL, 0.0 forward KL, 0.5 JSD")
    max_completion_length: int = Field(512, ge=1, description="tokens the student samples after each prompt at most")
    temperature: float = Field(1.0, gt=0, description="sampling temperature of the student's completions")

    def trl_kwargs(self) -> dict[str, Any]:
        return {
            "beta": self.beta,
            "max_completion_length": self.max_completion_length,
            "temperature": self.temperature,
        }


class DistillStage(Stage):
    name = "distill"
    description = "on-policy distillation from a teacher (DistillationTrainer): beta 1 reverse KL, 0 forward, 0.5 JSD"
    config_class = DistillStageConfig
    required_columns: ClassVar[tuple] = ("prompt",)

    def check(self, config: DistillStageConfig) -> None:
        """Teacher differs from the student and shares its vocabulary (config.json only, no weights)."""
        from transformers import AutoConfig

        from rufus_data.models.reference import ModelRef

        def config_of(ref: ModelRef):
            while ref.base:
                ref = ref.base
            return AutoConfig.from_pretrained(ref.folder())

        if not config.teacher:
            raise RufusError("distill needs a teacher: set `teacher: MODEL` (or --teacher MODEL), same tokenizer as the student")
        student, teacher = ModelRef.of(config.model), ModelRef.of(config.teacher)
        if teacher.portable == student.portable:
            raise RufusError(
                f"distill: the teacher ({config.teacher}) is the student's own starting point, so the divergence "
                "starts at 0 and nothing is learned: set `teacher` to a stronger model with the same tokenizer"
            )
        student_vocab = config_of(student).get_text_config().vocab_size
        teacher_vocab = config_of(teacher).get_text_config().vocab_size
        if student_vocab != teacher_vocab:
            raise RufusError(
                f"distill: the teacher's vocabulary ({teacher_vocab} tokens) differs from the student's "
                f"({student_vocab}): per-token divergences need the same tokenizer; pick a teacher of the same family"
            )

    def build_dataset(self, config: StageConfig, rows: pa.Table, tokenizer):
        from datasets import Dataset

        return Dataset.from_dict({"prompt": conversational(rows, "prompt")})

    def prepare(self, ctx: StageContext) -> None:
        from rufus_train.modeling import load_model

        if "teacher" not in ctx.extras:
            ctx.extras["teacher"] = load_model(ctx.config.teacher, ctx.config.dtype)

    def make_trainer(self, ctx: StageContext):
        from trl import DistillationTrainer

        return DistillationTrainer(
            teacher_model=ctx.extras["teacher"],
            **ctx.trainer_kwargs(),
        )


STAGE = DistillStage()
