"""A model reference, resolved once: what the user typed (a built-in name, a model folder, a LoRA
adapter, a run folder, a checkpoint, a hub id) turned into a `ModelRef` that commands hand along
instead of the text, so every caller asks the same resolved thing its folder, its adapter's base,
its run and step, and the form to record.

Resolving reads only small files (adapter_config.json, run.json's presence): a built-in is not
converted and nothing is downloaded or merged until a caller asks for a loadable folder
(`ModelRef.folder`; an adapter's merged copy is merged_model.py's `plain_folder`)."""

from __future__ import annotations

import difflib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from rufus_data.base.errors import RufusError
from rufus_data.folders.run_folder import ADAPTER_CONFIG, checkpoint_step_of, is_run_folder, run_of
from rufus_data.models.builtin import BUILTINS, builtin_path, pull
from rufus_data.models.hub import model_unavailable

Kind = Literal["builtin", "hub", "folder", "adapter", "run", "checkpoint"]


@dataclass(frozen=True)
class ModelRef:
    """One resolved model reference.

    `kind` says what the reference is: a built-in (by name or its cache folder), a hub id, a run
    folder, a `checkpoint-N` folder, a LoRA adapter folder that is neither, or any other model
    folder (RUN/merged included). A run or checkpoint trained with LoRA is an adapter too: `base`
    is set for every folder holding an adapter, whatever its kind."""

    text: str  # as the user gave it
    path: str  # what from_pretrained takes: the folder (a built-in's cache folder, maybe not built yet) or hub id
    kind: Kind
    portable: str  # the form to record (run.json, adapter_config.json): a built-in's name, a hub id, an absolute path
    base: ModelRef | None = None  # the model an adapter was trained on
    run: Path | None = None  # the run folder the model belongs to (the run, its checkpoint, its merged copy)
    step: int | None = None  # N of a checkpoint-N folder

    @classmethod
    def of(cls, ref: str | Path | ModelRef) -> ModelRef:
        """Resolve `ref` (a ModelRef is returned as it is). A file, or a path-like reference to a
        folder that does not exist, is refused; anything else not here is a hub id (loading it
        needs hub access or a populated HF cache)."""
        if isinstance(ref, ModelRef):
            return ref
        text = str(ref)
        if text in BUILTINS:
            return cls(text, str(builtin_path(text)), "builtin", text)
        path = Path(text).expanduser()
        if path.exists():
            if not path.is_dir():
                raise RufusError(f"model reference {text} is a file, not a model folder (config.json, weights, tokenizer)")
            return cls._of_folder(text, path)
        if text.startswith((".", "/", "~")):
            raise RufusError(f"model folder {text} does not exist: give a model folder, a hub id, or one of {sorted(BUILTINS)}")
        return cls(text, text, "hub", text)

    @classmethod
    def _of_folder(cls, text: str, path: Path) -> ModelRef:
        absolute = path.resolve()
        builtin = next((name for name in BUILTINS if absolute == builtin_path(name).resolve()), None)
        if builtin:
            return cls(text, str(path), "builtin", builtin)
        base = cls.of(_adapter_base_text(path)) if (path / ADAPTER_CONFIG).exists() else None
        step = checkpoint_step_of(path)
        kind: Kind = "checkpoint" if step is not None else "run" if is_run_folder(path) else \
            "adapter" if base else "folder"
        return cls(text, str(path), kind, str(absolute), base, run_of(path), step)

    @property
    def is_adapter(self) -> bool:
        return self.base is not None

    def folder(self) -> str:
        """What from_pretrained loads: `path`, a built-in converted into it first (once, cached).
        An adapter's folder holds only the adapter: merged_model.py's `plain_folder` merges it."""
        return str(pull(self.portable)) if self.kind == "builtin" else self.path

    def describe(self) -> str:
        """The reference in words, for reports and plans."""
        if self.kind == "builtin":
            return f"built-in {self.portable}"
        if self.kind == "hub":
            return f"hub model {self.text}"
        words = {"folder": f"folder {self.path}", "adapter": f"LoRA adapter {self.path}", "run": f"run {self.path}",
                 "checkpoint": f"checkpoint {self.step} of run {self.run}" if self.run else f"checkpoint {self.path}"}
        lora = f" (LoRA on {self.base.portable})" if self.base and self.kind != "adapter" else \
            f" on {self.base.portable}" if self.base else ""
        return words[self.kind] + lora


def _adapter_base_text(folder: Path) -> str:
    """The model an adapter folder was trained on, as its adapter_config.json records it (a
    portable reference, written by merged_model.py's `set_adapter_base`)."""
    base = json.loads((folder / ADAPTER_CONFIG).read_text()).get("base_model_name_or_path")
    if not base:
        raise RufusError(f"{folder}/{ADAPTER_CONFIG} does not name its base model (base_model_name_or_path): "
                         "set it to the model the adapter was trained on")
    return base


def require_loadable(model: str | ModelRef, what: str = "model") -> ModelRef:
    """`model` resolved, or a one-paragraph RufusError before any work when it can load from nowhere:
    a name with no `/` that is close to a built-in is a typo, refused without asking the hub; a hub
    id neither cached nor reachable (offline, no network) is refused without the minute of retries
    transformers would spend. A folder must exist (ModelRef.of); a built-in converts when it loads."""
    ref = ModelRef.of(model)
    if ref.kind != "hub":
        return ref
    near = difflib.get_close_matches(ref.text, list(BUILTINS), n=1, cutoff=0.75)
    problem = "it is no built-in and no folder here" if near and "/" not in ref.text else model_unavailable(ref.text)
    if problem:
        raise RufusError(unloadable_message(ref.text, problem, what))
    return ref


def unloadable_message(text: str, problem: str, what: str = "model") -> str:
    """The paragraph that answers a model reference that cannot load: why, a did-you-mean, the built-ins."""
    near = difflib.get_close_matches(text, list(BUILTINS), n=1, cutoff=0.6)
    hint = f" Did you mean {near[0]!r}?" if near else ""
    builtins = "; ".join(f"{name} ({spec.description})" for name, spec in BUILTINS.items())
    return (f"{what} {text!r} cannot be loaded: {problem}.{hint} The built-ins: {builtins}. Or give a model folder, "
            "or a hub id (ORG/NAME) that is in the Hugging Face cache here or reachable")
