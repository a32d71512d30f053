"""`rufus-train plan`: how many GPUs a pretraining run needs, the way the Smol training
playbook sizes it: total compute 6·N·D FLOPs over what one GPU really delivers (MFU x its dense
BF16 peak) for the days available."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from pydantic import Field

from rufus_data.base.errors import RufusError
from rufus_data.base.yaml_config import StrictModel

# Dense BF16 peak (no sparsity), TFLOP/s, from the vendors' data sheets.
GPU_PEAK_TFLOPS = {
    "a100": 312.0,
    "h100": 989.0,  # H100 SXM
    "h200": 989.0,
    "b200": 2250.0,
    "l40s": 362.0,
    "mi300x": 1307.0,
}
GpuKind = Literal[tuple(GPU_PEAK_TFLOPS)]  # the choices --gpu shows and checks


class PlanConfig(StrictModel):
    """The options of `rufus-train plan` (each field's description is its help)."""

    params: float = Field(gt=0, description="model parameters N, e.g. 3e9")
    tokens: float = Field(gt=0, description="training tokens D, e.g. 1.1e13")
    days: float = Field(gt=0, description="wall-clock days available")
    mfu: float = Field(0.3, gt=0, le=1, description="model FLOPs utilisation (0.3-0.5 typical)")
    gpu: GpuKind = Field("h100", description="GPU kind, by its dense bf16 peak (the table compares them all)")


@dataclass(frozen=True)
class Plan:
    params: float
    tokens: float
    days: float
    mfu: float
    gpu: str
    total_flops: float
    per_gpu_flops: float  # sustained FLOP/s of one GPU (mfu x peak)
    seconds: float
    gpus_exact: float

    @property
    def gpus(self) -> int:
        return math.ceil(self.gpus_exact - 1e-9)


def plan(params: float, tokens: float, days: float, mfu: float, gpu: str) -> Plan:
    key = gpu.lower()
    if key not in GPU_PEAK_TFLOPS:
        raise RufusError(f"unknown --gpu '{gpu}': known GPUs are {', '.join(GPU_PEAK_TFLOPS)}")
    if not 0 < mfu <= 1:
        raise RufusError(f"--mfu {mfu} must be a fraction in (0, 1] (0.3-0.5 is typical for dense training)")
    if min(params, tokens, days) <= 0:
        raise RufusError("--params, --tokens and --days must be positive")
    total = 6 * params * tokens
    per_gpu = mfu * GPU_PEAK_TFLOPS[key] * 1e12
    seconds = days * 86400
    return Plan(params, tokens, days, mfu, key, total, per_gpu, seconds, total / (per_gpu * seconds))


def explain(p: Plan) -> list[str]:
    """The formula with the numbers in it, one line each."""
    peak = GPU_PEAK_TFLOPS[p.gpu]
    return [
        f"compute   C = 6 x N x D = 6 x {p.params:.3g} x {p.tokens:.3g} = {p.total_flops:.3e} FLOPs",
        f"per GPU   mfu x peak = {p.mfu:g} x {peak:g} TFLOP/s ({p.gpu} bf16 dense) = {p.per_gpu_flops / 1e12:.1f} TFLOP/s",
        f"time      T = {p.days:g} days x 86400 s = {p.seconds:.4g} s",
        (
            f"GPUs      C / (mfu x peak x T) = {p.total_flops:.3e} / ({p.per_gpu_flops:.4g} x {p.seconds:.4g}) "
            f"= {p.gpus_exact:.1f} -> {p.gpus}"
        ),
    ]
