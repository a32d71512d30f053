"""One evaluation request: what is evaluated and how, in one model, whoever asks.

- `EvalSettings`: the suite, its tasks, the overrides (limit, samples, max_tokens, temperature)
  and the backend. The checkpoint evaluation's config (rufus_eval/checkpoint_eval/config.py) adds
  only its schedule to it; the pipeline's `eval:` block (rufus_train/pipeline.py) only changes
  its defaults.
- `EvalRequest`: those settings for one model, with where the results go; `rufus-eval suite`
  generates its options from it (rufus_data/cli_options.py), the checkpoint evaluation hands it
  to its process whole in job.json (`rufus-eval suite --request job.json`), the pipeline passes
  it to `run_suite`.
- `choose_backend`: the one `auto` policy (vLLM when a GPU and vLLM are here, else transformers),
  applied where the evaluation runs (`EvalRequest.resolved`), for every caller alike.

This module loads no lm-eval, torch or suite model: the CLI builds its options from it at start."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Literal

from pydantic import Field, field_validator, model_validator

from rufus_data import devices
from rufus_data.cli_options import Flag
from rufus_data.console import console
from rufus_data.errors import RufusError
from rufus_data.generate.backend_config import BackendConfig
from rufus_data.generate.vllm_command import default_command
from rufus_data.yaml_config import StrictModel, model_from_options

if TYPE_CHECKING:
    from rufus_data.benchmarks.suite import Suite

BACKENDS = ("auto", "hf", "vllm", "server")
# the backends of an evaluation that loads or serves a model folder itself (a checkpoint, a stage)
FolderBackend = Literal["auto", "hf", "vllm"]
CONCURRENCY = 8  # requests in flight against a vllm/server backend


class EvalSettings(StrictModel):
    """What an evaluation runs and how. Each field is also a `rufus-eval suite` option, its
    description the option's help."""

    suite: Annotated[str, Flag(argument=True)] = Field(
        description="suite name in catalogs/suites/ or a path to a suite YAML")
    tasks: Annotated[list[str] | None, Flag("--task")] = Field(
        None, description="run only this task of the suite (repeatable)")
    final: bool = Field(False, description="also run the test-role tasks")
    limit: int | None = Field(None, ge=1, description="documents per task (quick checks)")
    samples: int | None = Field(None, ge=1, description="override every task's k")
    max_tokens: int | None = Field(None, ge=1, description="override every task's max_tokens")
    temperature: float | None = Field(
        None, ge=0, description="override every task's sampling temperature (0: greedy decoding, one sample)")
    backend: Annotated[str, Flag(type=str)] = Field(
        "auto", description="auto (vllm when a GPU and vLLM are here, else hf) | hf (in-process) | vllm (Rufus starts "
        "vLLM) | server")
    data_parallel_size: int | None = Field(
        None, ge=1, description="vllm backend: --data-parallel-size (default: one replica per GPU of --devices)")
    max_model_len: int | None = Field(None, ge=1, description="vllm backend: --max-model-len of the server")
    batch_size: int = Field(16, ge=1, description="hf backend: lm-eval's batch size")
    concurrency: int = Field(CONCURRENCY, ge=1, description="vllm and server backends: requests in flight")
    strict: bool = Field(False, description="a task whose data is not here is an error (default: skipped, listed with "
                         "the command that fetches it)")

    @field_validator("backend")
    @classmethod
    def _known_backend(cls, backend: str) -> str:
        if backend not in BACKENDS:
            raise ValueError(f"unknown backend {backend!r}: use one of {', '.join(BACKENDS)}")
        return backend

    @model_validator(mode="after")
    def _greedy_is_one_sample(self) -> EvalSettings:
        if self.temperature == 0 and self.samples != 1:
            raise ValueError(f"greedy decoding (temperature 0) gives {self.samples or 'k'} copies of one answer: set "
                             "samples: 1, or a temperature above 0")
        return self

    def request(self, **run) -> EvalRequest:
        """These settings for one model (`checkpoint`) and where its results go."""
        return EvalRequest(**self.model_dump(include=set(EvalSettings.model_fields)), **run)


class EvalRequest(EvalSettings):
    """One evaluation of one model: the settings, the model, where the run goes."""

    checkpoint: Annotated[str, Flag("--ckpt")] = Field(
        description="model: folder, checkpoint, built-in name (smollm2-135m), or served name")
    out: Path | None = Field(None, description="run folder (default outputs/eval/<run>)")
    step: int | None = Field(None, description="training step of the checkpoint (default: N of checkpoint-N, a run "
                             "folder's run.json global_step, else 0 for a base model)")
    run_name: Annotated[str | None, Flag("--name")] = Field(None, description="run name (default suite-ckpt-time)")
    base_url: str | None = Field(None, description="server backend: OpenAI-compatible endpoint")
    tokenizer: str | None = Field(None, description="server backend: tokenizer folder (default: --ckpt)")
    devices: str | None = Field(None, description="vllm backend: CUDA_VISIBLE_DEVICES of the server, verbatim")
    report_to: Annotated[list[str], Flag("--report_to")] = Field(
        default_factory=list, description="log results and sample tables to wandb or trackio through lm-eval's loggers "
        "(project rufus, the run's name; repeatable)")

    @field_validator("report_to")
    @classmethod
    def _known_trackers(cls, report_to: list[str]) -> list[str]:
        unknown = [name for name in report_to if name not in ("wandb", "trackio")]
        if unknown:
            raise ValueError(f"--report_to {', '.join(unknown)}: the suite logs to wandb or trackio")
        return report_to

    def resolved(self) -> EvalRequest:
        """This request with `auto` decided (said on the console, with why) and its backend
        settings checked, before anything loads."""
        backend, why = choose_backend(self.backend)
        console.print(f"backend: {backend} ({why})", highlight=False, markup=False, soft_wrap=True)
        resolved = self.model_copy(update={"backend": backend})
        resolved.backend_config()  # refused here: a server without an endpoint
        return resolved

    def backend_config(self) -> BackendConfig:
        """How to reach the model, for a resolved request (rufus_eval/backends.py)."""
        if self.backend == "auto":
            raise ValueError("resolve the request first: `auto` is decided where the evaluation runs")
        return BackendConfig(
            backend=self.backend, base_urls=[self.base_url] if self.base_url else [], tokenizer=self.tokenizer,
            devices=self.devices, max_model_len=self.max_model_len, batch_size=self.batch_size,
            concurrency=self.concurrency,
            data_parallel_size=self.data_parallel_size or max(1, len(devices.gpu_ids(self.devices))),
            served_model_name=self.run_name if self.backend == "vllm" else None,  # the server carries the run's name
        )


def vllm_available() -> bool:
    """A vLLM server command Rufus can start ($RUFUS_VLLM_COMMAND, `vllm` on PATH, or the CPU build)."""
    try:
        default_command()
    except RufusError:
        return False
    return True


def choose_backend(requested: str) -> tuple[str, str]:
    """(backend, why): `auto` is vLLM when a GPU and vLLM are both here, else hf in-process."""
    if requested != "auto":
        return requested, "as asked"
    gpus = devices.gpu_count()
    if gpus and vllm_available():
        return "vllm", f"auto: {gpus} GPU(s) and vLLM found"
    return "hf", "auto: " + ("vLLM is not installed" if gpus else "no GPU") + ", so transformers in-process"


def apply_overrides(suite: Suite, request: EvalSettings) -> None:
    """samples, max_tokens and temperature for every task of `suite` (a metric at more samples
    than k falls back to @k)."""
    for task in suite.tasks:
        if request.samples:
            task.samples = request.samples
            at = task.metric.split("@")[-1]
            if task.kind == "rufus" and at != "k" and int(at) > request.samples:
                task.metric = task.metric.split("@")[0] + "@k"
        sampling = {"max_tokens": request.max_tokens, "temperature": request.temperature}
        sampling = {key: value for key, value in sampling.items() if value is not None}
        if sampling:
            task.sampling = suite.sampling_for(task).model_copy(update=sampling)


def request_from_cli(options: dict, request_file: Path | None = None) -> EvalRequest:
    """`rufus-eval suite`'s request: its options, over the fields of `--request FILE` when one is
    given (a JSON request, or a checkpoint evaluation's job.json, whose `request` it reads).
    Options left at their default do not override the file."""
    fields: dict = {}
    if request_file is not None:
        try:
            data = json.loads(Path(request_file).read_text())
        except (OSError, json.JSONDecodeError) as err:
            raise RufusError(f"--request {request_file}: not a readable JSON request ({err})") from None
        fields = data.get("request", data) if isinstance(data, dict) else None
        if not isinstance(fields, dict):
            raise RufusError(f"--request {request_file}: a request is a JSON object of EvalRequest's fields")
        options = {key: value for key, value in options.items() if value != EvalRequest.model_fields[key].default}
        if "db_path" in fields:  # written by Rufus before runs stopped sharing a DuckDB file
            console.print(f"--request {request_file}: db_path {fields.pop('db_path')} is no longer used (no run writes a "
                          "database; `rufus-eval results --runs DIR` queries the runs' results.json): ignored",
                          style="yellow", highlight=False, markup=False, soft_wrap=True)
    fields = {**fields, **options}
    if "suite" not in fields or "checkpoint" not in fields:
        raise RufusError("give a suite NAME and --ckpt MODEL (e.g. `rufus-eval suite quick --ckpt smollm2-135m`), "
                         "or --request FILE")
    return model_from_options(EvalRequest, fields)
