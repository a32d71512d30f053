"""The sampling and backend settings every generating command shares (`filter`, `pairs`): one
pydantic model, so a new knob (or a new default) is added in one place and reaches both."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence

from pydantic import Field

from rufus_data.generate import BackendConfig, SamplingParams
from rufus_data.generate.prompts import content_fingerprint
from rufus_data.yaml_config import StrictModel


class GenerationOptions(StrictModel):
    backend: str = "hf"  # hf | vllm | server
    max_tokens: int = Field(512, ge=1)
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    seed: int | None = 0
    base_urls: list[str] = Field(default_factory=list)
    served_model_name: str | None = None
    concurrency: int = Field(32, ge=1)
    vllm_command: list[str] | None = None
    devices: str | None = None
    max_model_len: int | None = None

    def sampling(self, n: int) -> SamplingParams:
        return SamplingParams(
            n=n,
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=self.top_k,
            min_p=self.min_p,
            repetition_penalty=self.repetition_penalty,
            max_tokens=self.max_tokens,
            seed=self.seed,
        )

    def backend_config(self, base_urls: list[str] | None = None) -> BackendConfig:
        return BackendConfig(
            backend=self.backend,
            base_urls=base_urls or self.base_urls,
            served_model_name=self.served_model_name,
            concurrency=self.concurrency,
            vllm_command=self.vllm_command,
            devices=self.devices,
            max_model_len=self.max_model_len,
        )

    def run_hash(self, n: int, inputs: Sequence[dict], **identity) -> str:
        """What makes two runs' samples interchangeable, the key of a resumable journal: `identity`
        (model, rewards, role), the sampling, the backend kind and the inputs by content (not their
        paths: a run resumes from another directory). URLs and concurrency change no sample."""
        key = {**identity, "backend": "hf" if self.backend == "hf" else "server",
               "sampling": self.sampling(n).to_dict(), "inputs": content_fingerprint(inputs)}
        return hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:16]
