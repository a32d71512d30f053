"""Loading policies once, putting LoRA on them, and merging adapters back.

A model reference is what `rufus_data.models.resolve_model` takes (built-in name, folder, hub
id) or a Rufus run folder. A run folder trained with LoRA holds only the adapter: loading it
loads its base (recursively: the base can itself be a run folder) and merges the adapter in,
so a pipeline stage starts from everything the previous stages learned (in memory; the one
merged copy on disk, RUN/merged, is rufus_data.merged_model's)."""

from __future__ import annotations

import copy
import warnings
from dataclasses import dataclass
from pathlib import Path

from rufus_data.errors import RufusError
from rufus_data.merged_model import adapter_base, copy_merged, is_adapter_folder, merged_model
from rufus_data.models import resolve_model

# TRL 1.16 switches checkpointing off and on around every GRPO generation with transformers 5's
# deprecated gradient_checkpointing_disable/enable: two FutureWarnings per step that no Rufus
# setting can avoid (TRL must rename its calls); Rufus's own code uses activation_checkpointing.
warnings.filterwarnings("ignore", message="`gradient_checkpointing_(disable|enable)` is deprecated",
                        category=FutureWarning)

_PRISTINE: dict[tuple[str, str], object] = {}  # loaded base models, never trained in place
_MAX_CACHED = 3


@dataclass(frozen=True)
class Precision:
    """How a stage trains: the dtype the weights load in, and the trainer's autocast switch.
    fp16 keeps fp32 weights (autocast to fp16 plus a gradient scaler, which refuses fp16 weights)."""

    dtype: str  # torch dtype name of the loaded weights
    bf16: bool
    fp16: bool


def native_bf16() -> bool:
    """A CUDA GPU that computes bf16 in hardware (Ampere or newer; ROCm), not by emulation."""
    import torch  # heavy: torch, transformers and peft load only when a model does (not for --help)

    return torch.cuda.is_available() and torch.cuda.is_bf16_supported(including_emulation=False)


def precision(name: str) -> Precision:
    """`dtype` of a stage config -> Precision. `auto`, as the Tulu 3 recipe trains on a 16 GB GPU:
    bf16 on a GPU that supports it natively, fp16 mixed precision with a gradient scaler on an
    older GPU (emulated bf16 is several times slower), fp32 on CPU. `float16` asks for fp16 mixed
    precision; `bfloat16` and `float32` load and train in that dtype."""
    import torch  # heavy: see native_bf16

    cuda = torch.cuda.is_available()
    if name == "auto":
        if not cuda:
            return Precision("float32", bf16=False, fp16=False)
        return Precision("bfloat16", bf16=True, fp16=False) if native_bf16() else Precision("float32", bf16=False, fp16=True)
    if name == "float16":
        if not cuda:
            raise RufusError("dtype: float16 trains with fp16 autocast and a gradient scaler, which need a CUDA GPU; "
                             "use dtype: auto (fp32 on CPU)")
        return Precision("float32", bf16=False, fp16=True)
    return Precision(name, bf16=name == "bfloat16" and cuda, fp16=False)


def torch_dtype(name: str):
    """The torch dtype the weights load in for a stage's `dtype` (see `precision`)."""
    import torch  # heavy: see native_bf16

    return getattr(torch, precision(name).dtype)


def load_model(ref: str, dtype: str = "auto"):
    """A fresh copy of the model behind `ref` (adapters merged); the base is read from disk once."""
    from transformers import AutoModelForCausalLM

    path = resolve_model(ref)
    key = (path, str(torch_dtype(dtype)))  # "auto" and "float32" share one copy on CPU
    if key not in _PRISTINE:
        if is_adapter_folder(path):
            from peft import PeftModel

            base = load_model(adapter_base(path), dtype)
            model = PeftModel.from_pretrained(base, path).merge_and_unload()
            model.name_or_path = path
        else:
            try:
                model = AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype(dtype))
            except OSError as err:
                raise RufusError(f"could not load model {ref} ({err}): give a model folder, run folder or hub id") from None
        if len(_PRISTINE) >= _MAX_CACHED:
            _PRISTINE.pop(next(iter(_PRISTINE)))
        _PRISTINE[key] = model
    return copy.deepcopy(_PRISTINE[key])


def load_tokenizer(ref: str):
    """The tokenizer of a model or run folder (a run folder keeps its own copy)."""
    from transformers import AutoTokenizer

    path = resolve_model(ref)
    if is_adapter_folder(path) and not (Path(path) / "tokenizer_config.json").exists():
        return load_tokenizer(adapter_base(path))
    tokenizer = AutoTokenizer.from_pretrained(path)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def apply_lora(model, settings):
    """Wrap `model` with a fresh LoRA adapter; the base is frozen and only lora_* params train."""
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(
        r=settings.r,
        lora_alpha=settings.lora_alpha,
        lora_dropout=settings.dropout,
        target_modules=list(settings.target_modules),
        task_type="CAUSAL_LM",
    )
    try:
        peft_model = get_peft_model(model, config)
    except ValueError as err:
        names = sorted({n.split(".")[-1] for n, _ in model.named_modules() if n})
        raise RufusError(
            f"lora.target_modules {settings.target_modules} do not match this model ({err}); "
            f"its module names include: {', '.join(n for n in names if not n.isdigit())[:400]}"
        ) from None
    check_only_adapter_trainable(peft_model)
    return peft_model


def check_only_adapter_trainable(model) -> None:
    stray = [n for n, p in model.named_parameters() if p.requires_grad and "lora_" not in n]
    if stray:
        raise RufusError(f"LoRA run has trainable base parameters {stray[:5]}: the base must stay frozen")


def trainable_parameters(model) -> tuple[int, int]:
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    total = sum(p.numel() for p in model.parameters())
    return trainable, total


def adapter_state(model) -> dict:
    """A detached copy of the trainable adapter tensors (to show they changed; DPO's frozen
    reference adapter is left out)."""
    return {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad and "lora_" in n}


def export_merged(run: str | Path, out: str | Path | None = None, overwrite: bool = False) -> Path:
    """A run's LoRA adapter merged into its base as a plain model folder: the run's one merged
    copy (RUN/merged, shared with rufus-eval), or a copy of it at `out`."""
    if out is None:
        return merged_model(run)
    return copy_merged(run, out, overwrite=overwrite)
