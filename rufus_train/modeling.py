"""Loading the model a stage trains (one copy, kept nowhere else), putting LoRA on it, and
merging adapters back.

A model reference is a `rufus_data.models.reference.ModelRef` (built-in name, folder, hub id, run
folder, checkpoint), or the text it is made from. A run folder trained with LoRA holds only the adapter: loading it
loads its base (recursively: the base can itself be a run folder) and merges the adapter in,
so a pipeline stage starts from everything the previous stages learned (in memory; the one
merged copy on disk, RUN/merged, is rufus_data.models.merged_model's)."""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path

from rufus_data.base.catalog_files import docs_page
from rufus_data.base.errors import RufusError
from rufus_data.folders.run_folder import TOKENIZER_CONFIG, read_run_json
from rufus_data.models.chat_template import read_chat_template
from rufus_data.models.embeddings import fit_for_adapter
from rufus_data.models.merged_model import copy_merged, merged_model
from rufus_data.models.reference import ModelRef

# TRL 1.16 switches checkpointing off and on around every GRPO generation with transformers 5's
# deprecated gradient_checkpointing_disable/enable: two FutureWarnings per step that no Rufus
# setting can avoid (TRL must rename its calls); Rufus's own code uses activation_checkpointing.
warnings.filterwarnings("ignore", message="`gradient_checkpointing_(disable|enable)` is deprecated",
                        category=FutureWarning)



@dataclass(frozen=True)
class Precision:
    """How a stage trains: the dtype the weights load in, and the trainer's autocast switch
    (bf16 or fp16; fp16 adds a gradient scaler, which refuses fp16 weights)."""

    dtype: str  # torch dtype name of the loaded weights
    bf16: bool
    fp16: bool

    @property
    def autocast(self) -> str | None:
        return "bf16" if self.bf16 else "fp16" if self.fp16 else None


# Why `auto` never trains full fine-tuning in pure bf16 (and what asking for it by name costs).
PURE_BF16_WARNING = (
    "dtype: bfloat16 with full fine-tuning trains in pure bf16: weights, gradients and AdamW states all in bf16, "
    "no fp32 master copy. That is the Smol training playbook's 'mystery of the melting GPUs': moving a run from "
    "DeepSpeed to plain data parallelism changed its losses because the weights and gradients were kept in bf16 "
    "with no fp32 master copy. It saves 8 bytes per parameter (8 instead of 16: weights 2 + gradients 2 + Adam "
    f"states 4). dtype: auto keeps fp32 master weights and optimizer states and computes in bf16 ({docs_page('train.md')}, "
    "precision)"
)


def gpu_kind() -> str | None:
    """The CUDA GPU this process trains on: 'bf16' when it computes bf16 in hardware (Ampere or
    newer; ROCm), 'fp16' for an older one (a T4, a V100: bf16 only emulated, several times
    slower), None without CUDA."""
    import torch  # heavy: torch, transformers and peft load only when a model does (not for --help)

    if not torch.cuda.is_available():
        return None
    return "bf16" if torch.cuda.is_bf16_supported(including_emulation=False) else "fp16"


def precision(name: str, full_finetune: bool) -> Precision:
    """`dtype` of a stage config -> Precision, as the Tulu 3 recipe trains. `auto`: on a native-bf16
    GPU, full fine-tuning loads fp32 weights and autocasts to bf16 (fp32 master weights, gradients
    and AdamW states), LoRA keeps the frozen base in bf16 (its adapter weights are fp32, see
    apply_lora); on an older GPU fp16 autocast with a gradient scaler over fp32 weights; fp32 on
    CPU. `float16` asks for fp16 mixed precision; `bfloat16` and `float32` load and train in that
    dtype (bfloat16 full fine-tuning is pure bf16: see PURE_BF16_WARNING)."""
    gpu = gpu_kind()
    if name == "auto":
        if gpu is None:
            return Precision("float32", bf16=False, fp16=False)
        if gpu == "fp16":
            return Precision("float32", bf16=False, fp16=True)
        return Precision("float32" if full_finetune else "bfloat16", bf16=True, fp16=False)
    if name == "float16":
        if gpu is None:
            raise RufusError("dtype: float16 trains with fp16 autocast and a gradient scaler, which need a CUDA GPU; "
                             "use dtype: auto (fp32 on CPU)")
        return Precision("float32", bf16=False, fp16=True)
    return Precision(name, bf16=name == "bfloat16" and gpu is not None, fp16=False)


def torch_dtype(name: str, full_finetune: bool = False):
    """The torch dtype the weights load in for a stage's `dtype` (see `precision`); a model that is
    not fully fine-tuned (a LoRA base, a teacher, a reference) may stay in bf16."""
    import torch  # heavy: see gpu_kind

    return getattr(torch, precision(name, full_finetune).dtype)


def load_model(ref: str | ModelRef, dtype: str = "auto", full_finetune: bool = False):
    """The model behind `ref` (adapters merged), read from disk, in the dtype `precision` gives it.
    Nothing is kept: a stage holds the one copy it trains (as plain TRL does), and a pipeline stage
    or teacher that needs a model again reads it again (safetensors: a fraction of a second per GB
    from the page cache) instead of every run keeping a spare copy in memory."""
    from transformers import AutoModelForCausalLM

    ref = ModelRef.of(ref)
    path = ref.folder()
    if ref.base:
        from peft import PeftModel

        base = load_model(ref.base, dtype, full_finetune)
        fit_for_adapter(base, path)
        model = PeftModel.from_pretrained(base, path).merge_and_unload()
        model.name_or_path = path
        return model
    try:
        return AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype(dtype, full_finetune))
    except OSError as err:
        raise RufusError(f"could not load model {ref.text} ({err}): give a model folder, run folder or hub id") from None


def load_tokenizer(ref: str | ModelRef, chat_template: str | None = None):
    """The tokenizer of a model or run folder (a run folder keeps its own copy; an adapter without
    one uses its base's). `chat_template`: a stage's `chat_template:` (a shipped name or a .jinja
    file), set on it: a base model ships none, and the run saves it with the model."""
    from transformers import AutoTokenizer

    ref = ModelRef.of(ref)
    path = ref.folder()
    if ref.base and not (Path(path) / TOKENIZER_CONFIG).exists():
        return load_tokenizer(ref.base, chat_template)
    tokenizer = AutoTokenizer.from_pretrained(path)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    if chat_template:
        tokenizer.chat_template = read_chat_template(chat_template, Path.cwd(), "chat_template")
    return tokenizer


def continue_adapter(ref: str | ModelRef, dtype: str, settings):
    """The adapter of the LoRA run `ref` on its base, trainable again (`lora.continue_adapter`): one
    adapter through a pipeline's stages, so that switching it off gives the original model, the
    reference of DPO and RL (the Tulu 3 mini notebook). Its shape must be the stage's `lora:`."""
    from peft import PeftModel

    ref = ModelRef.of(ref)
    if not ref.is_adapter:
        raise RufusError(f"lora.continue_adapter: {ref.text} is not a LoRA run (no adapter_config.json), so there "
                         "is no adapter to train further: start from a LoRA run, or set continue_adapter false")
    model = PeftModel.from_pretrained(load_model(ref.base, dtype), ref.folder(), is_trainable=True)
    saved = model.peft_config["default"]
    have = (saved.r, saved.lora_alpha, sorted(saved.target_modules))
    want = (settings.r, settings.lora_alpha, sorted(settings.target_modules))
    if have != want:
        raise RufusError(f"lora.continue_adapter: the adapter of {ref.text} has r, alpha, target_modules {have}, the "
                         f"stage's lora: asks for {want}: give the stage the adapter's settings")
    check_only_adapter_trainable(model)
    return model


def apply_lora(model, settings):
    """Wrap `model` with a fresh LoRA adapter; the base is frozen and only lora_* params train.
    The adapter weights are fp32 whatever the base's dtype (peft's autocast_adapter_dtype upcasts
    bf16/fp16 adapters, asked for explicitly here), so their AdamW states are fp32 too."""
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(
        r=settings.r,
        lora_alpha=settings.lora_alpha,
        lora_dropout=settings.dropout,
        target_modules=list(settings.target_modules),
        task_type="CAUSAL_LM",
    )
    try:
        peft_model = get_peft_model(model, config, autocast_adapter_dtype=True)
    except ValueError as err:
        names = sorted({n.split(".")[-1] for n, _ in model.named_modules() if n})
        raise RufusError(
            f"lora.target_modules {settings.target_modules} do not match this model ({err}); "
            f"its module names include: {', '.join(n for n in names if not n.isdigit())[:400]}"
        ) from None
    check_only_adapter_trainable(peft_model)
    return peft_model


def precision_report(trainer) -> dict:
    """What actually trained, read off the trainer after training (run.json records it): the
    dtypes of the frozen and the trainable weights, the autocast the accelerator ran, and the
    dtypes of the tensors the optimizer steps (the master weights: under DeepSpeed ZeRO its fp32
    partitions) and of its states (AdamW's moments)."""
    import torch  # heavy: see gpu_kind

    def names(tensors) -> list[str]:
        return sorted({str(t.dtype).removeprefix("torch.") for t in tensors})

    params = list(trainer.model.parameters())
    inner = trainer.optimizer
    while inner is not None and hasattr(inner, "optimizer"):  # accelerate's and DeepSpeed's wrappers
        inner = inner.optimizer
    stepped = [p for group in getattr(inner, "param_groups", []) for p in group["params"]]
    states = [v for state in getattr(inner, "state", {}).values() for v in state.values()
              if torch.is_tensor(v) and v.dim() > 0]  # AdamW's `step` is a scalar
    return {
        "frozen": names(p for p in params if not p.requires_grad),
        "trainable": names(p for p in params if p.requires_grad),
        "autocast": trainer.accelerator.mixed_precision,
        "optimizer_steps": names(stepped),
        "optimizer_states": names(states),
    }


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


def export_merged(run: str | Path | ModelRef, out: str | Path | None = None, overwrite: bool = False) -> Path:
    """A run's LoRA adapter merged into its base as a plain model folder: the run's one merged
    copy (RUN/merged, shared with rufus-eval, with its model card), or a copy of it at `out`."""
    from rufus_train.model_card import write_model_card

    run = ModelRef.of(run)
    merged = merged_model(run)
    summary = read_run_json(run.path)
    if summary:
        write_model_card(merged, summary, merged=True)
    return merged if out is None else copy_merged(run, out, overwrite=overwrite)
