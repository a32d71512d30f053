"""The attention kernel async GRPO packs rollouts with: TRL's tree attention loads it through the
`kernels` package, which downloads it from the Hub on first use (trl/experimental/async_grpo/
packing.py). Which one, whether this machine has it cached, and fetching it beforehand
(`rufus-train prefetch`) so that a GPU machine can train offline."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from rufus_data.base.errors import RufusError
from rufus_data.models.hub import offline_variable

# (repo, version) as TRL 1.16's packing._flash_attn asks for them
CUDA_KERNEL = ("kernels-community/flash-attn3", 1)
ROCM_KERNEL = ("kernels-community/aiter-flash-attn", 2)
INSTALL = "pip install -c constraints.txt -e \".[gpu]\" (the gpu extra brings kernels)"


def tree_attention_kernel() -> tuple[str, int]:
    """The kernel TRL's tree attention loads on this machine's torch build."""
    import torch  # heavy: only when the kernel is asked about

    return ROCM_KERNEL if torch.version.hip else CUDA_KERNEL


def kernels_missing() -> str | None:
    """Why the kernel cannot be loaded at all here: the `kernels` package is not installed."""
    if importlib.util.find_spec("kernels") is None:
        return f"the `kernels` package is not installed: {INSTALL}"
    return None


def cached_kernel() -> Path | None:
    """The cached build of the kernel for this machine's torch and accelerator, found without the
    network (what `kernels` itself reads offline); None when it is not cached."""
    from kernels import install_kernel  # optional: the gpu extra

    repo, version = tree_attention_kernel()
    try:
        return Path(install_kernel(repo, version=version, local_files_only=True))
    except Exception:  # noqa: BLE001 - whatever the cache lacks (the repo, the version, this build) means "not cached"
        return None


def prefetch() -> tuple[str, Path]:
    """Download the kernel's build for this machine into the cache (HF_HUB_CACHE, or KERNELS_CACHE),
    then read it back as an offline run will; (repo@version, its folder)."""
    missing = kernels_missing()
    if missing:
        raise RufusError(f"rufus-train prefetch: {missing}")
    variable = offline_variable()
    if variable:
        raise RufusError(f"rufus-train prefetch downloads from the Hugging Face Hub, but {variable} is set: unset it for "
                         "this command (run it while the machine is online)")
    from kernels import install_kernel  # optional: the gpu extra

    repo, version = tree_attention_kernel()
    name = f"{repo} (version {version})"
    try:
        install_kernel(repo, version=version)
    except Exception as err:  # noqa: BLE001 - the hub, the network, or no build for this torch/accelerator
        raise RufusError(
            f"rufus-train prefetch: could not fetch {name} ({type(err).__name__}: {err}). It fetches the build for this "
            "machine's torch and GPU: run it on the GPU machine while it is online (or on one with the same torch and "
            "CUDA, then copy the Hugging Face cache, or point KERNELS_CACHE at shared storage)"
        ) from None
    path = cached_kernel()
    if path is None:
        raise RufusError(f"rufus-train prefetch: {name} was fetched but cannot be read back from the cache offline")
    return name, path
