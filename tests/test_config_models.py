"""The config models, the keys a user writes. Their modules load no heavy library: a config is
read, checked and printed (`--dry-run`, `--help`, `rufus-train stages`) before any model loads,
and a command line built from one starts at once. And every key of a stage config says what it
does: `rufus-train stage NAME --help` prints the descriptions."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import typing
from pathlib import Path

import pytest
from pydantic import BaseModel, Field

REPO = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "trl", "lm_eval", "transformers", "peft", "vllm")
# the modules whose job is a config model; the stages' own (each stage's config class, what it
# inherits and the models its fields hold) are found from the registry below
CONFIG_MODULES = (
    "rufus_data.base.yaml_config", "rufus_data.base.cli_options", "rufus_data.models.devices", "rufus_data.generate.backend_config",
    "rufus_data.sources.catalog", "rufus_data.sources.dataset_source", "rufus_data.benchmarks.suite", "rufus_data.benchmarks.registry",
    "rufus_data.rollouts.options", "rufus_data.decontam.config", "rufus_data.dedup.config",
    "rufus_eval.request", "rufus_eval.checkpoint_eval.config",
    "rufus_train.config", "rufus_train.grpo.config", "rufus_train.stages",
)


def models_within(annotation) -> list[type[BaseModel]]:
    """The models a field's type holds: `X`, `X | None`, `list[X]`, `dict[str, X]`..."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [model for arg in typing.get_args(annotation) for model in models_within(arg)]


def models_of(roots: list[type[BaseModel]]) -> list[type[BaseModel]]:
    """The roots, every model they inherit from and every model their fields hold, recursively."""
    found: dict[type[BaseModel], None] = {}
    todo = list(roots)
    while todo:
        for model in todo.pop().__mro__:
            if model in found or not (isinstance(model, type) and issubclass(model, BaseModel)) \
                    or model.__module__.startswith("pydantic"):
                continue
            found[model] = None
            todo += [held for field in model.model_fields.values() for held in models_within(field.annotation)]
    return list(found)


def stage_config_models() -> list[type[BaseModel]]:
    from rufus_train.stages import all_stages

    return models_of([stage.config_class for stage in all_stages().values()])


# One interpreter; each module imported in a fork of it that has imported nothing of Rufus, so no
# module's imports hide another's. The fork starts with the light libraries most of them read
# (none of them loads a heavy one), so each import costs only its own.
LIGHT = ("pydantic", "yaml", "rich", "typer", "pyarrow", "numpy", "polars", "httpx", "huggingface_hub", "datasketch")
FORKED_IMPORTS = """
import importlib, json, os, sys
heavy, light, found = json.loads(sys.argv[1]), json.loads(sys.argv[2]), {}
for name in light:
    try:
        importlib.import_module(name)
    except ImportError:
        pass
assert not [name for name in heavy if name in sys.modules], "a light library loads a heavy one"
for module in sys.argv[3:]:
    read, write = os.pipe()
    if os.fork() == 0:
        os.close(read)
        try:
            importlib.import_module(module)
            loaded = [name for name in heavy if name in sys.modules]
        except BaseException as err:
            loaded = [f"import failed: {err!r}"]
        os.write(write, json.dumps(loaded).encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        found[module] = json.loads(pipe.read() or '["no answer"]')
    os.wait()
print(json.dumps(found))
"""


def heavy_modules_loaded(modules: list[str], heavy: tuple[str, ...] = HEAVY, path: Path = REPO) -> dict[str, list[str]]:
    """module -> the heavy libraries in sys.modules once that module alone is imported."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(path), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, "-c", FORKED_IMPORTS, json.dumps(heavy), json.dumps(LIGHT), *modules], check=False,
                          capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def undescribed_fields(models: list[type[BaseModel]]) -> list[str]:
    return [f"{model.__module__}.{model.__name__}.{name}" for model in models
            for name, field in model.model_fields.items() if not (field.description or "").strip()]


@pytest.mark.spawn  # a fresh interpreter imports the modules
def test_config_modules_load_no_heavy_library():
    modules = sorted(set(CONFIG_MODULES) | {model.__module__ for model in stage_config_models()})
    loaded = heavy_modules_loaded(modules)
    assert {module: names for module, names in loaded.items() if names} == {}
    assert sorted(loaded) == modules


def test_every_stage_config_key_has_a_description():
    models = stage_config_models()
    assert {"StageConfig", "LoraSettings", "CheckpointEvalConfig", "EvalSettings", "DeviceRoles",
            "GRPOStageConfig", "SFTStageConfig"} <= {model.__name__ for model in models}
    assert undescribed_fields(models) == []


def test_the_heavy_check_sees_a_module_level_import(tmp_path):
    (tmp_path / "fake_heavy.py").write_text("")
    (tmp_path / "eager_config.py").write_text("import fake_heavy\n")
    (tmp_path / "lazy_config.py").write_text("def load():\n    import fake_heavy\n")
    assert heavy_modules_loaded(["eager_config", "lazy_config"], ("fake_heavy",), tmp_path) == {
        "eager_config": ["fake_heavy"], "lazy_config": []}  # the first module's import does not hide in the second


class Inner(BaseModel):
    size: int = 1


class Outer(BaseModel):
    held: Inner | None = Field(None, description="a nested model")
    many: list[Inner] = Field(default_factory=list)
    rate: float = Field(0.1, description="a rate")


class Sub(Outer):
    rate: float = 0.2  # a new default drops the inherited description


def test_the_description_check_sees_nested_and_overridden_keys():
    models = models_of([Sub])
    assert models == [Sub, Outer, Inner]
    name = __name__
    assert undescribed_fields(models) == [f"{name}.Sub.many", f"{name}.Sub.rate", f"{name}.Outer.many",
                                          f"{name}.Inner.size"]
