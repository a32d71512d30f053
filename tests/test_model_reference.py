"""A model reference is resolved once into a ModelRef (rufus_data/models/reference.py), which the
commands hand along: each kind on the built-in tiny-random and local folders (a LoRA adapter, a
run with a checkpoint), the errors the text gets, and that eval's plan and runner, and training's
tokenizer and model, resolve the text once between them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rufus_data.base.errors import RufusError
from rufus_data.models import builtin
from rufus_data.models.builtin import builtin_path
from rufus_data.models.merged_model import plain_folder, set_adapter_base
from rufus_data.models.reference import ModelRef


@pytest.fixture
def resolutions(monkeypatch) -> list[str]:
    """The texts ModelRef.of resolves from here on (a ModelRef handed back as it is is no resolution)."""
    made: list[str] = []
    resolve = ModelRef.of.__func__

    def counted(cls, ref):
        if not isinstance(ref, ModelRef):
            made.append(str(ref))
        return resolve(cls, ref)

    monkeypatch.setattr(ModelRef, "of", classmethod(counted))
    return made


def adapter_folder(folder: Path, base: str) -> Path:
    """The small files of a LoRA adapter: enough to resolve, not to load."""
    folder.mkdir(parents=True)
    (folder / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": base}))
    return folder


@pytest.fixture(scope="module")
def lora_adapter(tiny_model, tmp_path_factory) -> Path:
    """A real LoRA adapter on tiny-random, its base recorded by name, without a tokenizer."""
    from rufus_train import modeling
    from rufus_train.config import LoraSettings

    folder = tmp_path_factory.mktemp("adapter") / "lora"
    modeling.apply_lora(modeling.load_model(tiny_model, "float32"), LoraSettings()).save_pretrained(folder)
    set_adapter_base(folder, "tiny-random")
    return folder


def test_a_builtin_by_name_is_resolved_without_converting_it(tiny_model, monkeypatch):
    monkeypatch.setattr(builtin, "pull", lambda name: pytest.fail("resolving converted the built-in"))
    ref = ModelRef.of("tiny-random")
    assert (ref.kind, ref.path, ref.portable, ref.base, ref.run) == ("builtin", str(builtin_path("tiny-random")),
                                                                      "tiny-random", None, None)
    assert ref.describe() == "built-in tiny-random"
    monkeypatch.undo()
    assert ref.folder() == tiny_model


def test_a_builtins_cache_folder_is_that_builtin(tiny_model):
    ref = ModelRef.of(tiny_model)
    assert (ref.kind, ref.path, ref.portable) == ("builtin", tiny_model, "tiny-random")


def test_a_hub_id_passes_through():
    ref = ModelRef.of("HuggingFaceTB/SmolLM2-135M-Instruct")
    assert (ref.kind, ref.path, ref.portable, ref.folder()) == ("hub", *["HuggingFaceTB/SmolLM2-135M-Instruct"] * 3)
    assert ref.describe() == "hub model HuggingFaceTB/SmolLM2-135M-Instruct"


def test_a_plain_folder_is_recorded_by_its_absolute_path(tmp_path, monkeypatch):
    (tmp_path / "models" / "mine").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    ref = ModelRef.of("models/mine")
    assert (ref.kind, ref.path, ref.portable, ref.run) == ("folder", "models/mine", str(tmp_path / "models" / "mine"), None)
    assert ref.folder() == "models/mine" and ref.describe() == "folder models/mine"


def test_a_file_or_a_missing_folder_is_refused(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(RufusError, match="is a file, not a model folder"):
        ModelRef.of(tmp_path / "config.json")
    with pytest.raises(RufusError, match="model folder ./no/such/folder does not exist"):
        ModelRef.of("./no/such/folder")


def test_an_adapter_carries_its_resolved_base(tmp_path):
    ref = ModelRef.of(adapter_folder(tmp_path / "lora", "tiny-random"))
    assert (ref.kind, ref.is_adapter, ref.base.kind, ref.base.portable) == ("adapter", True, "builtin", "tiny-random")
    assert ref.describe() == f"LoRA adapter {tmp_path / 'lora'} on tiny-random"
    stacked = ModelRef.of(adapter_folder(tmp_path / "second", str(tmp_path / "lora")))
    assert stacked.base.base.portable == "tiny-random"  # an adapter on an adapter: resolved down to the built-in
    with pytest.raises(RufusError, match="does not name its base model"):
        ModelRef.of(adapter_folder(tmp_path / "nameless", ""))


def test_a_run_and_its_checkpoint_know_their_run_and_step(tmp_path):
    run = adapter_folder(tmp_path / "run", "tiny-random")
    (run / "run.json").write_text(json.dumps({"global_step": 4}))
    adapter_folder(run / "checkpoint-4", "tiny-random")
    (run / "merged").mkdir()

    whole = ModelRef.of(run)
    assert (whole.kind, whole.run, whole.step, whole.is_adapter) == ("run", run.resolve(), None, True)
    assert whole.describe() == f"run {run} (LoRA on tiny-random)"
    checkpoint = ModelRef.of(run / "checkpoint-4")
    assert (checkpoint.kind, checkpoint.run, checkpoint.step) == ("checkpoint", run.resolve(), 4)
    assert checkpoint.describe() == f"checkpoint 4 of run {run.resolve()} (LoRA on tiny-random)"
    merged = ModelRef.of(run / "merged")
    assert (merged.kind, merged.run, merged.is_adapter) == ("folder", run.resolve(), False)


def test_resolving_a_model_ref_returns_it():
    ref = ModelRef.of("HuggingFaceTB/SmolLM2-135M-Instruct")
    assert ModelRef.of(ref) is ref


def test_eval_plan_and_runner_resolve_the_checkpoint_once(tiny_model, resolutions):
    from rufus_eval.plan import resolve
    from rufus_eval.request import EvalRequest
    from rufus_eval.runner import local_model

    resolved = resolve(EvalRequest(suite="quick", checkpoint=tiny_model, backend="hf", limit=1), say=False)
    assert local_model(resolved.model) == tiny_model
    assert resolutions == [tiny_model]


def test_generating_with_a_lora_run_loads_its_merged_copy(lora_adapter, tiny_model):
    """`rufus-data filter --policy RUN` / `pairs` on a LoRA run: the adapter folder alone is no model
    (from_pretrained looked its base name up on the hub); the hf backend loads the merged copy."""
    from rufus_data.generate.hf import HFGenerator

    generator = HFGenerator(ModelRef.of(lora_adapter), dtype="float32", device="cpu")
    assert generator.lm.name_or_path == str(lora_adapter / "merged")
    assert generator.tokenizer.name_or_path == str(lora_adapter / "merged")


def test_training_loads_tokenizer_model_and_merged_copy_from_one_resolution(lora_adapter, tiny_model, resolutions):
    from rufus_train import modeling

    ref = ModelRef.of(lora_adapter)
    assert resolutions == [str(lora_adapter), "tiny-random"]  # the adapter, and its base once, as it is resolved
    assert modeling.load_tokenizer(ref).name_or_path == tiny_model  # the adapter has none: its base's
    assert modeling.load_model(ref, "float32").name_or_path == str(lora_adapter)
    assert plain_folder(ref) == str(lora_adapter / "merged")
    assert resolutions == [str(lora_adapter), "tiny-random"]
