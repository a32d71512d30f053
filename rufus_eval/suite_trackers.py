"""`rufus-eval suite --report_to wandb|trackio`: each task's lm-eval output (results and the
sample tables) logged through lm-eval's own loggers (lm_eval.loggers), one tracker run per suite
run, in project `rufus` (WANDB_PROJECT / TRACKIO_PROJECT win) under the suite run's name: the
naming rufus-train's runs use."""

from __future__ import annotations

import contextlib
import importlib.util
import os
from collections.abc import Iterator

from rufus_data.base.errors import RufusError

PROJECT = "rufus"
TRACKERS = {"wandb": "WANDB_PROJECT", "trackio": "TRACKIO_PROJECT"}


def with_sample_metrics(output: dict) -> dict:
    """The output with each task's `metric_list` naming the scores its samples hold: a Rufus metric
    (`rufus_avg`) writes `avg@k`, `unscored`, ... into each sample, and lm-eval's W&B table reads
    the samples by metric name."""
    configs = {}
    for task, config in (output.get("configs") or {}).items():
        samples = (output.get("samples") or {}).get(task) or [{}]
        named = [m.get("metric") for m in config.get("metric_list") or []]
        if all(name in samples[0] for name in named):
            configs[task] = config
            continue
        scores = [key for key, value in samples[0].items() if isinstance(value, (int, float)) and key != "doc_id"]
        configs[task] = {**config, "metric_list": [{"metric": key} for key in scores]}
    return {**output, "configs": configs}


class SuiteTrackers:
    def __init__(self, loggers: list):
        self.loggers = loggers

    def log(self, output: dict | None) -> None:
        """One task's `simple_evaluate` output: its results, then its samples as tables/traces."""
        if not output:
            return
        output = with_sample_metrics(output)
        for logger in self.loggers:
            logger.post_init(output)
            logger.log_eval_result()
            if output.get("samples"):
                logger.log_eval_samples(output["samples"])


def check_trackers(report_to: list[str]) -> None:
    """A tracker's package is installed: refused before a model loads."""
    for name in report_to:
        if importlib.util.find_spec(name) is None:
            raise RufusError(f"--report_to {name} needs the `{name}` package, which is not installed: "
                             f"`pip install {name}` (the `track` extra), or drop --report_to")


@contextlib.contextmanager
def suite_trackers(report_to: list[str], run_name: str, config: dict) -> Iterator[SuiteTrackers]:
    """The loggers of a suite run, open for its duration and finished after it."""
    check_trackers(report_to)
    loggers = []
    if "wandb" in report_to:
        from lm_eval.loggers import WandbLogger

        loggers.append(WandbLogger(init_args={"project": os.environ.get(TRACKERS["wandb"]) or PROJECT,
                                              "name": run_name, "job_type": "eval"}, config_args=config))
    if "trackio" in report_to:
        from lm_eval.loggers.trackio_logger import TrackioLogger

        loggers.append(TrackioLogger(init_args={"project": os.environ.get(TRACKERS["trackio"]) or PROJECT,
                                                "name": run_name, "config": config}))
    try:
        yield SuiteTrackers(loggers)
    finally:
        for logger in loggers:
            finish = getattr(logger, "finish", None) or getattr(logger.run, "finish", None)
            if finish:
                finish()
