"""Shared fixtures: the data root (a missing one fails, never skips) and the built-in model,
converted once per test session."""

from __future__ import annotations

import os
import sys
from itertools import islice
from pathlib import Path

import pytest
import shared_vllm
from openai_stub import OpenAIStub

from rufus_data.base import jsonl

REPO = Path(__file__).resolve().parents[1]
# Before torch loads anywhere in the session: the suite shares 2 cores with a vLLM server, and
# OpenMP threads that spin while waiting steal them (one hf generation measured 69 s, not 7.8 s).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


# Under pytest-xdist (`-n 2`) each worker is one pytest process on a 2-core machine: one torch thread
# each (and in the processes they start), or the workers' OpenMP threads fight over the cores.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ["OMP_NUM_THREADS"] = "1"
    if "torch" in sys.modules:  # loaded before this file (by a plugin): the variable came too late
        sys.modules["torch"].set_num_threads(1)

# Tests that use these fixtures run the real built-in model: marked `model` (see pyproject's markers).
REAL_MODEL_FIXTURES = {"builtin_model", "builtin_tokenizer"}


@pytest.hookimpl(tryfirst=True)  # before `-m` selects by marker
def pytest_collection_modifyitems(config, items):
    """Markers from the fixtures a test uses: `model` for the real built-in model, `vllm` for the
    shared vLLM server. `slow` tests are opt-in: RUFUS_SLOW=1 (see README)."""
    for item in items:
        used = set(getattr(item, "fixturenames", ()))
        if used & REAL_MODEL_FIXTURES:
            item.add_marker(pytest.mark.model)
        if "vllm_server" in used:
            item.add_marker(pytest.mark.vllm)
    if os.environ.get("RUFUS_SLOW") == "1":
        return
    skip = pytest.mark.skip(reason="slow end-to-end run: set RUFUS_SLOW=1 to include it")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def data_root() -> Path:
    value = os.environ.get("RUFUS_DATA_ROOT")
    assert value, "RUFUS_DATA_ROOT must point at the shared data folder (make test sets it)"
    path = Path(value)
    assert (path / "gsm8k" / "train.jsonl").exists(), f"RUFUS_DATA_ROOT={value} does not hold gsm8k/train.jsonl"
    return path


def read_jsonl(path: Path, limit: int | None = None) -> list[dict]:
    return list(islice(jsonl.read_jsonl(path), limit))


@pytest.fixture
def hub_offline(monkeypatch):
    """No hub: HF_HUB_OFFLINE for what starts later, and `datasets` (read its environment at import)
    told at once, so a hub dataset fails at once from the empty cache instead of retrying a network."""
    import datasets

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)


class ModelLoaded(AssertionError):
    """A command loaded (or started) a model where it promised not to."""


@pytest.fixture
def no_model_loads(monkeypatch):
    """Fail the test the moment anything loads a model or starts a generation engine: transformers'
    from_pretrained (any model class), the hf generator, a vLLM server, lm-eval's evaluation, a
    generation backend. What a `--dry-run` promises, checked rather than assumed. Tokenizers and
    configs may load: a plan counts tokens."""
    import lm_eval.evaluator
    import transformers.modeling_utils
    import transformers.models.auto.auto_factory
    import transformers.models.auto.modeling_auto

    from rufus_data.generate import backends, base, hf, launcher

    def refuse(what):
        def loaded(*args, **kwargs):
            raise ModelLoaded(f"{what} was called under a promise to load no model")
        return loaded

    monkeypatch.setattr(transformers.modeling_utils.PreTrainedModel, "from_pretrained",
                        classmethod(refuse("PreTrainedModel.from_pretrained")))
    # Each Auto class (AutoModelForCausalLM, ...) copies from_pretrained when its module is first
    # imported: imported above, not under the patch (a copy of the refusal would outlive this
    # test), and each copy patched here.
    base_auto = transformers.models.auto.auto_factory._BaseAutoModelClass
    for auto in (base_auto, *base_auto.__subclasses__()):
        monkeypatch.setattr(auto, "from_pretrained", classmethod(refuse("AutoModel*.from_pretrained")))
    monkeypatch.setattr(hf.HFGenerator, "__init__", refuse("HFGenerator"))
    monkeypatch.setattr(launcher.VLLMServer, "start", refuse("a vLLM server"))
    monkeypatch.setattr(backends, "open_generator", refuse("open_generator"))
    monkeypatch.setattr(base.Generator, "__enter__", refuse("a generator (any backend)"))
    monkeypatch.setattr(lm_eval.evaluator, "simple_evaluate", refuse("lm_eval.simple_evaluate"))
    monkeypatch.setattr(lm_eval, "simple_evaluate", refuse("lm_eval.simple_evaluate"))


@pytest.fixture
def openai_stub():
    """Start stand-in OpenAI servers (tests/openai_stub.py): `openai_stub(respond, **options)`
    returns a started OpenAIStub; every one started is stopped after the test."""
    started: list[OpenAIStub] = []

    def start(respond=None, **options) -> OpenAIStub:
        stub = OpenAIStub(respond, **options).start()
        started.append(stub)
        return stub

    yield start
    for stub in started:
        stub.stop()


@pytest.fixture(scope="session")
def builtin_model() -> str:
    """Folder of the converted built-in SmolLM2-135M (converted once, cached in $RUFUS_CACHE)."""
    from rufus_data.models.builtin import pull

    return str(pull("smollm2-135m"))


@pytest.fixture(scope="session")
def tiny_model() -> str:
    """Folder of the built-in `tiny-random` (2 layers x 64, random weights, the real tokenizer and
    chat template), built once into $RUFUS_CACHE in seconds. For tests of mechanics: guards,
    staging, callbacks, resume, launch, wiring. Tests that judge behaviour use `builtin_model`.
    (Building it converts smollm2-135m first, for its tokenizer; it does not depend on the
    `builtin_model` fixture, so its tests are not marked `model`.)"""
    from rufus_data.models.builtin import pull

    return str(pull("tiny-random"))


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny_model):
    """smollm2-135m's own tokenizer and chat template (tiny-random's copies, byte for byte): for
    tests of masks, templates and token counts, which do not need the real model's weights."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model)


@pytest.fixture(scope="session")
def builtin_tokenizer(builtin_model):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(builtin_model)


@pytest.fixture(scope="session")
def vllm_server(builtin_model, tmp_path_factory):
    """ONE real vLLM CPU server for the built-in model, shared by the whole test session.

    Started through rufus_data.generate.launcher from REPO/.venv-vllm (`python -m
    vllm.entrypoints.openai.api_server`, --enforce-eager, max_model_len 2048; ready in ~30 s,
    ~4.6 GB RAM) and stopped by its process group when the session ends. Skipped, with the
    reason printed, only when .venv-vllm/.installed is missing (`make vllm-venv` installs it).
    Returns the launcher's VLLMServer: `.base_url` (http://127.0.0.1:PORT, without /v1),
    `.model` (the served name, "smollm2-135m"), `.pgid`; the max_model_len is 2048. Under
    pytest-xdist every worker gets the same server (tests/shared_vllm.py)."""
    from rufus_data.generate.vllm_command import CPU_VENV

    if not (CPU_VENV / ".installed").exists():
        reason = f"vLLM CPU build not installed ({CPU_VENV}/.installed missing): run `make vllm-venv`"
        print(f"\nSKIP vllm_server: {reason}")
        pytest.skip(reason)
    if os.environ.get("PYTEST_XDIST_WORKER"):
        with shared_vllm.shared_server(tmp_path_factory.getbasetemp().parent, builtin_model) as server:
            yield server
        return
    server = shared_vllm.start_server(builtin_model)
    try:
        yield server
    finally:
        shared_vllm.stop_server(server)
