"""Checks that run before any model or dataset loads: a configuration that would fail (or
silently train nothing) an hour into a run is refused here, with a message that says what to
change. Each check is a small function that raises RufusError; `check_stage` runs the ones that
apply to every stage. Where each rule comes from is in docs/train.md ("Guards")."""

from __future__ import annotations

import importlib.util
import re
import warnings
from pathlib import Path

from rufus_data.base.console import console
from rufus_data.base.errors import RufusError
from rufus_data.folders.output_lock import check_unlocked
from rufus_data.folders.run_folder import finished_steps, is_run_folder
from rufus_data.folders.shards import refuse_existing_output
from rufus_train.checkpoints import LATEST, storage
from rufus_train.data import check_data
from rufus_train.launch import engine_keeps_fp32_masters, takes_output_lock
from rufus_train.modeling import PURE_BF16_WARNING

# Module names whose weights the loss reads directly (output head) or that are looked up, not
# multiplied (embeddings): a LoRA adapter there never receives a gradient through the loss.
HEAD_AND_EMBEDDING_MODULES = {
    "lm_head": "the loss reads lm_head.weight directly (chunked log-probs), so an adapter there would never train",
    "embed_tokens": "the embedding table is indexed, not multiplied; train it fully or leave it frozen",
    "embed_out": "the loss reads the output head's weight directly, so an adapter there would never train",
    "wte": "the embedding table is indexed, not multiplied; train it fully or leave it frozen",
    "word_embeddings": "the embedding table is indexed, not multiplied; train it fully or leave it frozen",
}

# peft's prompt-learning methods, in the spellings a user might write (PeftType value, class name).
PROMPT_LEARNING_METHODS = {
    "prompt_tuning": "PromptTuning",
    "prefix_tuning": "PrefixTuning",
    "p_tuning": "P-Tuning",
    "multitask_prompt_tuning": "MultitaskPromptTuning",
    "adaption_prompt": "AdaptionPrompt",
}

REPORTERS = {"wandb": "wandb", "trackio": "trackio", "tensorboard": "tensorboard"}


def _normalise_method(method: str) -> str:
    """'PrefixTuningConfig', 'PREFIX_TUNING', 'prefix-tuning', 'P-Tuning' -> 'prefix_tuning' / 'p_tuning'."""
    name = re.sub(r"config$", "", method.strip(), flags=re.IGNORECASE)
    name = re.sub(r"(?<=[a-z])(?=[A-Z])", "_", name)
    return re.sub(r"[\s\-]+", "_", name).lower()


def check_peft_method(method: str) -> None:
    """Only LoRA is supported; prompt-learning methods are refused with a pointer to LoRA."""
    key = _normalise_method(method)
    if key in PROMPT_LEARNING_METHODS:
        raise RufusError(
            f"lora.method '{method}' ({PROMPT_LEARNING_METHODS[key]}) is a prompt-learning method: TRL's trainers "
            "compute the loss over the model's own sequence and do not train virtual tokens reliably. Use LoRA: "
            "set `lora.method: lora` (rank with `lora.r`, modules with `lora.target_modules`)"
        )
    if key not in {"lora"}:
        raise RufusError(f"lora.method '{method}' is not supported: Rufus trains LoRA adapters (set `lora.method: lora`)")


def check_peft_config(peft_config: object) -> None:
    """The same rule for a peft config object handed in from Python."""
    try:
        from peft import PromptLearningConfig
    except ImportError:  # pragma: no cover - peft is a train dependency
        return
    if isinstance(peft_config, PromptLearningConfig):
        check_peft_method(type(peft_config).__name__)


def check_lora_targets(target_modules: list[str] | str) -> None:
    """Refuse LoRA on the output head or the embeddings: the loss never trains an adapter there."""
    names = [target_modules] if isinstance(target_modules, str) else list(target_modules)
    for name in names:
        for module, why in HEAD_AND_EMBEDDING_MODULES.items():
            if name.split(".")[-1] == module or (_looks_like_regex(name) and re.search(name, f"model.{module}")):
                kept = [n for n in names if n != name] or ["q_proj", "k_proj", "v_proj", "o_proj"]
                raise RufusError(
                    f"lora.target_modules contains '{name}': {why}. Remove it and keep "
                    f"{', '.join(kept)}; to train the head, fine-tune without LoRA (`lora.enabled: false`)"
                )


def _looks_like_regex(name: str) -> bool:
    return any(ch in name for ch in "*+?[]()|\\^$")


def check_reporters(report_to: list[str]) -> None:
    """`report_to: wandb/trackio` needs the package installed: fail now, not at the first log."""
    for name in report_to:
        package = REPORTERS.get(name)
        if package and importlib.util.find_spec(package) is None:
            raise RufusError(
                f"report_to '{name}' needs the `{package}` package, which is not installed: "
                f"`pip install {package}`, or set `report_to: none`"
            )


def check_push_token(repo_id: str | None) -> None:
    """`push_to_hub` needs a token that huggingface_hub finds (HF_TOKEN, `hf auth login`): say so
    before training, not after it."""
    if repo_id:
        from huggingface_hub import get_token

        if not get_token():
            raise RufusError(f"push_to_hub {repo_id} needs a Hub token with write access: set HF_TOKEN or run "
                             "`hf auth login`, or remove push_to_hub")


def check_data_folders(data: list[str], stage: str) -> None:
    """The shard folders (or mixture catalogs) must exist and be valid before anything loads."""
    check_data(data, stage)


def check_output_dir(output_dir: str, overwrite: bool, resume: str | None) -> None:
    """A run folder another live process writes is refused first, whatever the flags; a finished
    run is not overwritten by accident (resume and overwrite are explicit); one that stopped before
    its first checkpoint is taken over."""
    out = Path(output_dir)
    if takes_output_lock():
        check_unlocked(out)
    if out.exists() and any(out.iterdir()) and not overwrite and not resume and not taken_over(out):
        finished = finished_steps(out)
        held = f"a run ({', '.join(finished[:4])}{', ...' if len(finished) > 4 else ''})" if finished else "files"
        raise RufusError(
            f"output_dir {out} already holds {held}: pass --overwrite to replace it, "
            "--resume_from_checkpoint latest (or PATH) to continue it, or choose another --output_dir"
        )
    if overwrite and not resume and out.exists() and any(out.iterdir()):
        refuse_existing_output(out, overwrite)  # --overwrite replaces a run folder, never a folder of other files


def taken_over(out: Path) -> bool:
    """A run folder with no finished step (run_folder.finished_steps): the next run takes it over."""
    return is_run_folder(out) and not finished_steps(out)


def check_precision(config) -> None:
    """Pure bf16 full fine-tuning is trained only when asked for by name, and then with a warning
    (DeepSpeed ZeRO and FSDP keep fp32 master shards of their own, so they are not warned)."""
    if config.dtype == "bfloat16" and not config.lora.enabled and not engine_keeps_fp32_masters(config):
        console.print(f"[bold yellow]warning:[/] {PURE_BF16_WARNING}", highlight=False, soft_wrap=True)
        warnings.warn(PURE_BF16_WARNING, UserWarning, stacklevel=2)


def check_resume(output_dir: str, resume: str | None, mirror: str | None) -> None:
    """A named checkpoint exists; a mirror opens (its fsspec backend installed) and is not the
    run folder itself, whose checkpoint-N folders it would replace."""
    if not resume and not mirror:
        return

    if resume and resume != LATEST and not Path(resume).is_dir():
        raise RufusError(
            f"resume_from_checkpoint {resume} is not a folder: give a checkpoint-N folder of the run, or `latest` "
            "(the newest complete one of output_dir or checkpoint_mirror, or a fresh run when there is none)"
        )
    if mirror:
        fs, root = storage(mirror)
        if "file" in fs.protocol and Path(root).resolve() == Path(output_dir).resolve():
            raise RufusError(f"checkpoint_mirror {mirror} is output_dir itself: give another folder or a URL")


def check_stage(config) -> None:
    """The checks every stage runs before loading anything (stages add their own)."""
    if config.lora.enabled:
        check_peft_method(config.lora.method)
        check_lora_targets(config.lora.target_modules)
    check_precision(config)
    check_reporters(config.report_to)
    check_push_token(config.push_to_hub)
    check_data_folders(config.data, config.stage)
    check_output_dir(config.output_dir, config.overwrite, config.resume_from_checkpoint)
    check_resume(config.output_dir, config.resume_from_checkpoint, config.checkpoint_mirror)
    config.devices.check()  # every pair of GPU roles: trainer, vLLM server, checkpoint evaluation

