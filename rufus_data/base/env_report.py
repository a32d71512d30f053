"""`rufus-data env` (also `rufus-train env`, `rufus-eval env`): what a bug report needs about the
machine, as `trl env` prints it. Package versions come from their metadata, so vLLM and lm-eval
are not imported; torch is, for its CUDA build and the GPUs it sees."""

from __future__ import annotations

import os
import platform
import sys
from importlib import metadata

import typer
from rich.table import Table

from rufus_data.base.catalog_files import constraints_file, shipped_root, source_checkout
from rufus_data.base.console import cli_errors, print_result
from rufus_data.base.paths import cache_dir
from rufus_data.base.version import code_version

PACKAGES = ("torch", "transformers", "trl", "peft", "accelerate", "vllm", "lm_eval", "datasets", "deepspeed")


def package_version(name: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "not installed"


def _torch_rows() -> list[tuple[str, str]]:
    try:
        import torch
    except ImportError:
        return [("CUDA", "torch not installed")]
    gpus = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] if torch.cuda.is_available() else []
    return [
        ("torch CUDA build", torch.version.cuda or "none (CPU build)"),
        ("GPUs seen", f"{len(gpus)}: {', '.join(gpus)}" if gpus else "0"),
        ("CUDA_VISIBLE_DEVICES", os.environ.get("CUDA_VISIBLE_DEVICES", "(not set)")),
    ]


def environment_rows() -> list[tuple[str, str]]:
    """(what, value) rows: Rufus, Python, platform, torch's CUDA and GPUs, the libraries' versions."""
    checkout = source_checkout()
    return [
        ("Rufus", code_version().describe()),
        ("Rufus runs from", f"checkout {checkout}" if checkout else "installed package"),
        ("shipped catalogs", str(shipped_root())),
        ("Python", sys.version.split()[0] + f" ({sys.executable})"),
        ("platform", platform.platform()),
        *_torch_rows(),
        *((name, package_version(name)) for name in PACKAGES),
        *setting_rows(),
    ]


OFFLINE_SWITCHES = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE")


def setting_rows() -> list[tuple[str, str]]:
    """Where the data and the cache are, and whether the hub is switched off: what decides whether a
    run finds its benchmarks and models offline."""
    root = os.environ.get("RUFUS_DATA_ROOT")
    cache = os.environ.get("RUFUS_CACHE")
    return [
        ("RUFUS_DATA_ROOT", root or "(not set: tasks and stage data that need local benchmark copies are skipped "
                                    "or refused)"),
        ("RUFUS_CACHE", f"{cache} -> {cache_dir()}" if cache else f"(not set) -> {cache_dir()}"),
        *((name, os.environ.get(name) or "(not set)") for name in OFFLINE_SWITCHES),
    ]


@cli_errors
def env_command(
    constraints: bool = typer.Option(False, "--constraints", help="print instead the versions CI last tested, "
                                     "for `pip install -c FILE` (rufus-data env --constraints > constraints.txt)"),
) -> None:
    """Print the environment for a bug report: Rufus, Python, platform, torch's CUDA, GPUs, library versions,
    the data root, the cache and the offline switches."""
    if constraints:
        sys.stdout.write(constraints_file().read_text())
        return
    table = Table(title="rufus environment (paste it into a bug report)")
    table.add_column("what", style="bold")
    table.add_column("value")
    for what, value in environment_rows():
        table.add_row(what, value)
    print_result(table)
