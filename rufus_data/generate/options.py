"""The sampling and backend settings every generating command shares (`filter`, `pairs`): one
pydantic model, so a new knob (or a new default) is added in one place and reaches both, as a
field and as a command-line option. Also the `--reward` specs both take."""

from __future__ import annotations

import hashlib
import json
import shlex
from collections.abc import Sequence
from typing import Annotated

import yaml
from pydantic import Field

from rufus_data.cli_options import Flag
from rufus_data.errors import RufusError
from rufus_data.generate import BackendConfig, SamplingParams
from rufus_data.generate.prompts import content_fingerprint
from rufus_data.yaml_config import StrictModel


def parse_reward_option(values: list[str]) -> list[str | dict]:
    """`--reward` values: `name:arg` strings, or YAML/JSON mappings such as
    `{name: string_match, extractor: gsm8k, answer_column: expected_output}`."""
    specs: list[str | dict] = []
    for value in values:
        text = value.strip()
        if text.startswith("{"):
            try:
                spec = yaml.safe_load(text)
            except yaml.YAMLError as err:
                raise RufusError(f"--reward {value!r} is not a valid YAML mapping ({err}); e.g. '{{name: string_match}}'") from None
            if not isinstance(spec, dict):
                raise RufusError(f"--reward {value!r} must be a mapping like '{{name: string_match, extractor: gsm8k}}'")
            specs.append(spec)
        else:
            specs.append(text)
    return specs


# the reward specs of filter and pairs, and their `--reward` option
RewardSpecs = Annotated[
    list[str | dict],
    Field(description="reward spec, repeatable: 'string_match:gsm8k' or '{name: string_match, answer_column: expected_output}'"),
    Flag(type=list[str], parse=parse_reward_option),
]


class GenerationOptions(StrictModel):
    # each field is also a `rufus-data filter/pairs` option (rufus_data/cli_options.py), its
    # description the option's help

    backend: str = Field(
        "hf", description="hf (transformers, in-process) | vllm (Rufus starts a vLLM server) | server (--base-url)"
    )
    max_tokens: int = Field(512, ge=1, description="tokens per sample")
    temperature: float = Field(1.0, description="sampling temperature; 1.0 = the model's own distribution, as in RL")
    top_p: float = Field(1.0, description="nucleus sampling: the smallest set of tokens holding this probability (1.0 = off)")
    top_k: int = Field(0, description="sample among the k most likely tokens (0 = off)")
    min_p: float = Field(0.0, description="drop tokens below this fraction of the top token's probability (0 = off)")
    repetition_penalty: float = Field(1.0, description="penalty on tokens already in the prompt or completion (1.0 = off)")
    seed: int | None = Field(0, description="run seed; per-prompt and per-sample seeds derive from it")
    base_urls: Annotated[list[str], Flag("--base-url")] = Field(
        default_factory=list, description="server backend: OpenAI-compatible endpoint URL, repeatable"
    )
    served_model_name: str | None = Field(
        None, description="the model's name at the server (server: as the endpoint knows it; vllm: as Rufus serves it)"
    )
    concurrency: int = Field(32, ge=1, description="server/vllm: requests in flight")
    vllm_command: Annotated[list[str] | None, Flag(type=str, parse=shlex.split)] = Field(
        None,
        description="vllm: server command (default: $RUFUS_VLLM_COMMAND, else `vllm serve` if on PATH, "
        "else `.venv-vllm/bin/python -m vllm.entrypoints.openai.api_server`)",
    )
    devices: str | None = Field(None, description="vllm: CUDA_VISIBLE_DEVICES of the server")
    max_model_len: int | None = Field(None, description="vllm: --max-model-len of the server")

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
