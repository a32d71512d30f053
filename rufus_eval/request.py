"""One evaluation request: what is evaluated and how, in one model, whoever asks.

- `EvalSettings`: the suite, its tasks, the overrides (limit, repeats, max_tokens, temperature)
  and the backend. The checkpoint evaluation's config (rufus_eval/checkpoint_eval/config.py) adds
  only its schedule to it; the pipeline's `eval:` block (rufus_train/pipeline.py) only changes
  its defaults.
- `EvalRequest`: those settings for one model, with where the results go; `rufus-eval suite`
  generates its options from it (rufus_data/base/cli_options.py), the checkpoint evaluation hands it
  to its process whole in job.json (`rufus-eval suite --request job.json`), the pipeline passes
  it to `run_suite`.
- How the model is reached (backend, server URLs, launch settings) is rufus_data's `ModelAccess`,
  the same settings filter and pairs take; its `auto` is decided where the evaluation runs
  (`EvalRequest.resolved`), for every caller alike.

k, the answers sampled per document, is `repeats` (lm-eval's task-config name for it): lm-eval's
`--samples` picks documents. `--samples` and a `samples` key (job.json, a pipeline's or a stage's
`eval:` block) still work, with a note.

This module loads no lm-eval, torch or suite model: the CLI builds its options from it at start."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from rufus_data.base.cli_options import Flag, comma_list
from rufus_data.base.console import console
from rufus_data.base.errors import RufusError
from rufus_data.base.yaml_config import config_source, model_from_options, renamed_key
from rufus_data.generate.backend_config import FolderBackend, ModelAccess
from rufus_data.models import devices

if TYPE_CHECKING:
    from rufus_data.benchmarks.suite import Suite

__all__ = ["EvalRequest", "EvalSettings", "FolderBackend", "apply_sampling_overrides", "request_from_cli"]
CONCURRENCY = 8  # requests in flight against a vllm/server backend
Tracker = Literal["wandb", "trackio"]  # lm-eval's loggers that the suite logs to
TRACKERS: tuple[str, ...] = Tracker.__args__  # type: ignore[attr-defined]
REPEATS_RENAMED = "lm-eval's --samples picks documents; repeats is its name for the answers sampled per document"


class EvalSettings(ModelAccess):
    """What an evaluation runs and how (how the model is reached: ModelAccess). Each field is also
    a `rufus-eval suite` option, its description the option's help."""

    suite: Annotated[str, Flag(argument=True, metavar="SUITE")] = Field(
        description="suite name in catalogs/suites/ or a path to a suite YAML")
    tasks: Annotated[list[str] | None, Flag("--tasks", metavar="TASK", parse=comma_list, aliases=("--task",))] = Field(
        None, description="run only these tasks of the suite: comma-separated (gsm8k,math500), as lm-eval takes them, "
        "or repeated")
    final: bool = Field(False, description="also run the test-role tasks")
    limit: int | None = Field(None, ge=1, description="documents per task (quick checks)")
    repeats: Annotated[int | None, Flag(old_names=("--samples",), renamed_because=REPEATS_RENAMED)] = Field(
        None, ge=1, description="override every task's k, the answers sampled per document (lm-eval's `repeats`)")
    max_tokens: int | None = Field(None, ge=1, description="override every task's max_tokens")
    seed: int | None = Field(None, description="override the suite's seed (sampling, lm-eval's random, numpy and "
                             "torch seeds)")
    temperature: float | None = Field(
        None, ge=0, description="override every task's sampling temperature (0: greedy decoding, one sample)")
    data_parallel_size: int | None = Field(
        None, ge=1, description="vllm: the server's --data-parallel-size (default: one replica per GPU of --devices)")
    batch_size: int = Field(16, ge=1, description="hf: lm-eval's batch size")
    concurrency: int = Field(CONCURRENCY, ge=1, description="vllm and server: requests in flight")
    strict: bool = Field(False, description="a task whose data is not here is an error (default: skipped, listed with "
                         "the command that fetches it)")

    @model_validator(mode="before")
    @classmethod
    def _samples_is_repeats(cls, data: Any, info: ValidationInfo) -> Any:
        """Settings written before k was `repeats` (a job.json, an `eval:` block) still read."""
        data, renamed = renamed_key(data, "samples", "repeats")
        if renamed:
            say_repeats_renamed(config_source(info, "the evaluation settings"))
        return data

    @model_validator(mode="after")
    def _greedy_is_one_sample(self) -> EvalSettings:
        if self.temperature == 0 and self.repeats != 1:
            raise ValueError(f"greedy decoding (temperature 0) gives {self.repeats or 'k'} copies of one answer: set "
                             "repeats: 1, or a temperature above 0")
        return self

    def request(self, **run) -> EvalRequest:
        """These settings for one model (`checkpoint`) and where its results go."""
        return EvalRequest(**{**self.model_dump(include=set(EvalSettings.model_fields)), **run})


class EvalRequest(EvalSettings):
    """One evaluation of one model: the settings, the model, where the run goes."""

    checkpoint: Annotated[str, Flag("--ckpt")] = Field(
        description="model: folder, checkpoint, built-in name (smollm2-135m), or served name")
    out: Path | None = Field(None, description="run folder (default outputs/eval/<run>)")
    step: int | None = Field(None, description="training step of the checkpoint (default: N of checkpoint-N, a run "
                             "folder's run.json global_step, else 0 for a base model)")
    run_name: Annotated[str | None, Flag("--name")] = Field(
        None, description="run name: the run folder's name under outputs/eval (default suite-ckpt-time)")
    overwrite: bool = Field(False, description="replace an existing run folder (never a folder Rufus did not write)")
    report_to: Annotated[list[Tracker], Flag("--report-to")] = Field(
        default_factory=list, description="log results and sample tables to wandb or trackio through lm-eval's loggers "
        "(project rufus, the run's name; repeatable)")

    @model_validator(mode="before")
    @classmethod
    def _one_base_url(cls, data: Any) -> Any:
        """A request written before the URL setting was shared (`base_url`, one endpoint) reads as
        `base_urls`; lm-eval talks to one endpoint, so more are refused."""
        if isinstance(data, dict) and "base_url" in data:
            data = dict(data)
            url = data.pop("base_url")
            if url and not data.get("base_urls"):
                data["base_urls"] = [url]
        return data

    @model_validator(mode="after")
    def _one_endpoint(self) -> EvalRequest:
        if len(self.base_urls) > 1:
            raise ValueError(f"rufus-eval talks to one endpoint: give one --base-url, not {len(self.base_urls)}")
        return self

    @field_validator("run_name")
    @classmethod
    def _one_folder_name(cls, name: str | None) -> str | None:
        """The name is joined to outputs/eval: one plain folder name, never a path out of it."""
        if name is not None and (not name.strip() or name in (".", "..") or name.startswith(".")
                                 or any(sep in name for sep in ("/", "\\", "\0"))):
            raise ValueError(f"--name {name!r} is not a folder name: the run folder is outputs/eval/NAME, so a name "
                             "has no / and does not start with a dot; give --out DIR to write the run elsewhere")
        return name

    @field_validator("report_to", mode="before")
    @classmethod
    def _known_trackers(cls, report_to: Any) -> Any:
        unknown = [name for name in report_to or [] if name not in TRACKERS]
        if unknown:
            raise ValueError(f"--report_to {', '.join(unknown)}: the suite logs to wandb or trackio")
        return report_to

    def access(self, base_urls: list[str] | None = None) -> ModelAccess:
        """How to reach the model, for a resolved request (rufus_eval/lm_eval_models.py): a vLLM server
        Rufus starts carries the run's name and one replica per GPU of --devices by default."""
        if self.backend == "auto":
            raise ValueError("resolve the request first: `auto` is decided where the evaluation runs")
        access = super().access(base_urls)
        if self.backend == "vllm":
            access = access.model_copy(update={
                "served_model_name": self.served_model_name or self.run_name,
                "data_parallel_size": self.data_parallel_size or max(1, len(devices.gpu_ids(self.devices)))})
        return access


def say_repeats_renamed(where: str) -> None:
    console.print(f"note: {where}: `samples` is now `repeats` ({REPEATS_RENAMED}); read as `repeats`: rename it there",
                  style="yellow", highlight=False, markup=False, soft_wrap=True)


def apply_sampling_overrides(suite: Suite, request: EvalSettings) -> None:
    """The suite's seed, and repeats, max_tokens and temperature for every task of `suite` (a metric at
    more samples than k falls back to @k)."""
    if request.seed is not None:
        suite.seed = request.seed
    for task in suite.tasks:
        if request.repeats:
            task.repeats = request.repeats
            at = task.metric.split("@")[-1]
            if task.kind == "rufus" and at != "k" and int(at) > request.repeats:
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
        try:
            fields, renamed = renamed_key(fields, "samples", "repeats")  # written before k was `repeats`
        except ValueError as err:
            raise RufusError(f"--request {request_file}: {err}") from None
        if renamed:
            say_repeats_renamed(f"--request {request_file}")
        if "db_path" in fields:  # written by Rufus before runs stopped sharing a DuckDB file
            console.print(f"--request {request_file}: db_path {fields.pop('db_path')} is no longer used (no run writes a "
                          "database; `rufus-eval results --runs DIR` queries the runs' results.json): ignored",
                          style="yellow", highlight=False, markup=False, soft_wrap=True)
    fields = {**fields, **options}
    if "suite" not in fields or "checkpoint" not in fields:
        raise RufusError("give a suite NAME and --ckpt MODEL (e.g. `rufus-eval suite quick --ckpt smollm2-135m`), "
                         "or --request FILE")
    return model_from_options(EvalRequest, fields)
