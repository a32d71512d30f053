"""One stage run, start to end, the same for every stage:

    guards (no loading) -> run folder -> tokenizer + model (once) -> LoRA -> dataset
    -> TRL config -> stage's trainer -> train -> adapter/model + run.json

The run folder (its names and run.json's reader and writer: rufus_data/folders/run_folder.py):

    OUT/config.yaml      the resolved config (what --dry-run prints)
    OUT/train.log        the run's log: Rufus, transformers and TRL (INFO and up), Python warnings,
                         and one line per trainer log (loss, grad norm, ...)
    OUT/metrics.jsonl    one JSON line per trainer log (loss, lr, grad norm, stage metrics)
    OUT/data/NAME/       the catalogs of `data:`, mixed when the run starts
    OUT/lineage.json     the data's lineage (rufus_data/folders/lineage.py): written once the data is ready
                         (a GRPO stage's `filter:` trains on its chosen buckets: grpo/prompt_filter.py)
    OUT/checkpoint-N/    TRL/transformers checkpoints, rufus_complete.json written last (checkpoints.py);
                         `--resume_from_checkpoint latest` resumes from the newest complete one, and
                         `checkpoint_mirror` copies each to a second place (mirror.py)
    OUT/adapter_*        the LoRA adapter (or the full model when lora.enabled is false) + tokenizer;
                         adapter_config.json names the base as a portable reference (`smollm2-135m`)
    OUT/README.md        the model card (rufus_train/model_card.py)
    OUT/run.json         written last: stage, base model, steps, final metrics, the dtypes that trained
                         (weights, autocast, optimizer), how far the weights moved (and a warning when
                         they barely did), the data's lineage, timings, versions
    OUT/merged/          made on demand (rufus-eval, `rufus-train export`): the adapter merged in
"""

from __future__ import annotations

import contextlib
import importlib
import json
import logging
import os
import shutil
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.markup import escape

from rufus_data.base.console import console, print_result
from rufus_data.base.errors import RufusError
from rufus_data.base.redaction import RedactingFormatter
from rufus_data.folders.output_lock import OutputLock
from rufus_data.folders.run_folder import (
    CONFIG_YAML,
    LINEAGE_JSON,
    METRICS,
    RUN_JSON,
    TRAIN_LOG,
    read_run_json,
    write_run_json,
)
from rufus_data.folders.shards import package_versions, refuse_existing_output
from rufus_data.models.chat_template import read_chat_template
from rufus_data.models.chat_template import record as chat_template_record
from rufus_data.models.embeddings import fit_embeddings
from rufus_data.models.loss_mask import LossMask, check_prompt_render
from rufus_data.models.merged_model import set_adapter_base
from rufus_data.models.reference import ModelRef
from rufus_eval.checkpoint_eval.callback import CheckpointEvalCallback
from rufus_train import checkpoints, data, guards, launch, modeling, weight_update
from rufus_train.config import StageConfig
from rufus_train.config_loading import resolved_yaml
from rufus_train.divergence import DivergenceGuard, divergence_message
from rufus_train.grpo.prompt_filter import filter_stage_data
from rufus_train.mirror import Mirror, open_mirror
from rufus_train.model_card import write_model_card
from rufus_train.push import push_run
from rufus_train.resume import resume_checkpoint
from rufus_train.run_summary import summary_table, write_train_curves
from rufus_train.stages import StageContext, check_config, get_stage
from rufus_train.step_progress import StepClock, say, step_line
from rufus_train.trl_args import build_trl_args

log = logging.getLogger("rufus_train")
TEST_HOOKS = "RUFUS_TEST_HOOKS"
CONVERSATION_COLUMNS = {"messages", "prompt", "chosen"}  # rows a chat template renders  # a module whose install(trainer) the kill-and-resume tests use


@dataclass
class RunResult:
    output_dir: Path
    global_step: int
    metrics: list[dict]
    trainable_params: int
    total_params: int
    initial_adapter: dict = field(default_factory=dict, repr=False)  # tensors before training (LoRA)
    trainer: Any = field(default=None, repr=False)


def metrics_callback(path: Path, shown_metrics: tuple):
    from transformers import TrainerCallback

    class MetricsToJsonl(TrainerCallback):
        """Appends every trainer log to metrics.jsonl (the file a person or rufus-eval reads), and
        a line of it to train.log; each logged step's progress line (step_progress.py, the stage's
        `shown_metrics`) goes to the console. A run shorter than `logging_steps` logs every step,
        so it too has its per-step lines and its train_curves.png."""

        def __init__(self):
            self.clock = StepClock()

        def on_train_begin(self, args, state, control, **kwargs):
            if 0 < state.max_steps < state.logging_steps:
                log.info("logging every step: the run has %d steps, fewer than logging_steps %d",
                         state.max_steps, state.logging_steps)
                state.logging_steps = 1

        def on_step_begin(self, args, state, control, **kwargs):
            self.clock.step_begins(state.global_step)

        def on_log(self, args, state, control, logs=None, **kwargs):
            if state.is_world_process_zero and logs:
                with open(path, "a") as fh:
                    fh.write(json.dumps({"step": state.global_step, **logs}, default=float) + "\n")
                shown = ", ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in logs.items())
                log.info("step %d: %s", state.global_step, shown)
                if "train_runtime" not in logs:  # the closing log: the summary table shows it
                    line = step_line(state.global_step, state.max_steps, logs, shown_metrics,
                                     self.clock.seconds_per_step(state.global_step))
                    say(escape(line))

    return MetricsToJsonl()


LOGGED = ("rufus_train", "rufus_data", "transformers", "trl", "peft", "accelerate", "py.warnings")


@contextlib.contextmanager
def run_logging(output_dir: Path):
    """For the run's duration, OUT/train.log receives the INFO lines of Rufus, transformers, TRL,
    peft and accelerate, and Python warnings; the console keeps showing what it showed before
    (the libraries' own stderr handlers stay at their level, warnings are still printed)."""
    handler = logging.FileHandler(output_dir / TRAIN_LOG)
    handler.setFormatter(RedactingFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    handler.setLevel(logging.INFO)
    loggers = [logging.getLogger(n) for n in LOGGED]
    levels = [lg.level for lg in loggers]
    quieted = []  # the libraries' console handlers, held at the level their logger had
    for lg in loggers:
        effective = lg.getEffectiveLevel()
        for console_handler in lg.handlers:
            if console_handler.level == logging.NOTSET:
                console_handler.setLevel(effective)
                quieted.append(console_handler)
        lg.addHandler(handler)
        lg.setLevel(min(effective, logging.INFO))
    show_warning = warnings.showwarning

    def show_and_log(message, category, filename, lineno, file=None, line=None):
        logging.getLogger("py.warnings").warning(warnings.formatwarning(message, category, filename, lineno, line).rstrip())
        show_warning(message, category, filename, lineno, file, line)

    warnings.showwarning = show_and_log
    try:
        yield
    finally:
        warnings.showwarning = show_warning
        for lg, level in zip(loggers, levels, strict=True):
            lg.removeHandler(handler)
            lg.setLevel(level)
        for console_handler in quieted:
            console_handler.setLevel(logging.NOTSET)
        handler.close()


def prepare_output(config: StageConfig, held: contextlib.ExitStack) -> tuple[Path, str | None, int | None]:
    """The run folder, the checkpoint the run resumes from (`latest` resolved: in output_dir,
    else restored from the mirror; None for a fresh run), and the step the run already finished
    at (None unless that checkpoint is at max_steps: then nothing in the folder is touched).
    The folder's lock is taken first, into `held` (kept for the run), so --overwrite never
    removes a folder another process writes."""
    out = Path(config.output_dir)
    if launch.takes_output_lock():
        held.enter_context(OutputLock(out, f"rufus-train stage {config.stage}"))
    if out.exists() and not config.resume_from_checkpoint and guards.taken_over(out):
        console.print(f"note: {out} holds no finished step (no checkpoint, no run.json: a run that stopped before "
                      "its first checkpoint): taken over", style="yellow", highlight=False, markup=False, soft_wrap=True)
        shutil.rmtree(out)
    elif out.exists() and config.overwrite and not config.resume_from_checkpoint:
        refuse_existing_output(out, overwrite=True)  # checked again under the lock: a run folder, or empty
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)
    if config.checkpoint_mirror:
        open_mirror(config.checkpoint_mirror)
    resume = resume_checkpoint(config.resume_from_checkpoint, out, config.checkpoint_mirror)
    done = finished_step(config, out, resume)
    if done is not None:
        return out, resume, done
    (out / CONFIG_YAML).write_text(resolved_yaml(config))
    if resume:  # the metrics up to the checkpoint's step, none the killed job logged after it
        checkpoints.rewrite_metrics(out / METRICS, resume)
    else:
        (out / METRICS).unlink(missing_ok=True)
    (out / RUN_JSON).unlink(missing_ok=True)  # run.json marks a finished run: written again at the end
    (out / LINEAGE_JSON).unlink(missing_ok=True)  # written again once the data is ready
    return out, resume, None


def finished_step(config: StageConfig, out: Path, resume: str | None) -> int | None:
    """The step of a checkpoint at the run's max_steps (the configured one, else the one it
    recorded): resuming would train past it (transformers trains one more batch before it checks
    max_steps), so a retried finished job would over-train. None when there is more to train."""
    if not resume:
        return None
    step, recorded = checkpoints.trained_steps(resume)
    if step < (config.max_steps if config.max_steps > 0 else recorded):
        return None
    if not read_run_json(out):
        raise RufusError(
            f"{Path(resume).name} is at max_steps ({step}) but {out} has no {RUN_JSON}: the run trained every step "
            f"and stopped while saving its result. The checkpoint folder {resume} holds the trained model; to train "
            "again, run with --overwrite (or raise --max_steps to train further)"
        )
    return step


def already_done(config: StageConfig, out: Path, step: int) -> RunResult:
    """A finished run resumed again (a scheduler retrying a job that succeeded): said, not trained."""
    run = read_run_json(out)
    console.print(f"[green]stage {config.stage} already done[/]: {out} finished at step {step} (max_steps), nothing "
                  "trained or written; raise --max_steps to train further, or --overwrite to train again",
                  highlight=False, soft_wrap=True)
    metrics = [json.loads(line) for line in (out / METRICS).read_text().splitlines()] if (out / METRICS).exists() else []
    return RunResult(out, step, metrics, run.get("trainable_params", 0), run.get("total_params", 0))


def run_stage(config: StageConfig, *, model=None, tokenizer=None, extras: dict | None = None) -> RunResult:
    """Run one stage. `model`/`tokenizer` may be passed in (already loaded; the model is trained
    in place), otherwise they are loaded from `config.model` (one copy: modeling.load_model keeps none)."""
    with contextlib.ExitStack() as held:  # the run folder's lock, from prepare_output to the end of the run
        return _run_stage(config, held, model, tokenizer, extras)


def _run_stage(config: StageConfig, held: contextlib.ExitStack, model, tokenizer, extras: dict | None) -> RunResult:
    """The run in the order of the module docstring; each step is one function below."""
    refuse_launched_stage(config)
    check_config(config)
    starting = ModelRef.of(config.model)  # the tokenizer, the model and the adapter's recorded base
    callbacks = [checkpoint_eval_callback(config)]
    # several processes: one prepares (and restores a mirrored checkpoint), the others wait
    out, resume, done = launch.on_main_process(prepare_output, config, held)
    if done is not None:
        return already_done(config, out, done)
    config = config.model_copy(update={"resume_from_checkpoint": resume})  # `latest` resolved, for the stage too
    mirror = Mirror(config.checkpoint_mirror) if config.checkpoint_mirror else None
    started = time.time()
    with run_logging(out):
        log.info("stage %s: model %s, data %s, output %s", config.stage, config.model, config.data, out)
        if resume:
            log.info("resuming from %s", resume)
        # catalogs are mixed before any weights load, by one process; the lineage is on disk from here
        folders, lineage = launch.on_main_process(data.prepare_data, config.data, out, config.model, config.eval.suite)
        if getattr(config, "filter", None) is not None:  # a GRPO stage's `filter:`: its learnable prompts only
            folders, lineage = launch.on_main_process(filter_stage_data, config, folders, out, lineage)
        rows = data.read_rows(folders, config.max_rows, config.seed, config.stage)
        model, tokenizer = load_policy(config, starting, model, tokenizer, rows.column_names)
        trainable, total = modeling.trainable_parameters(model)
        log.info("trainable parameters: %s of %s", f"{trainable:,}", f"{total:,}")
        guard = DivergenceGuard()
        watch = get_stage(config.stage).watch(config)  # after the metrics callback: a step's line, then its warning
        callbacks = [checkpoints.CompleteCheckpoints(mirror), guard, metrics_callback(out / METRICS, config.progress_metrics),
                     *filter(None, [watch, *callbacks])]
        loss = get_stage(config.stage).loss_mask(config, tokenizer)
        if loss is not None:  # said once; build_dataset decides the same again
            log.info("%s", loss.describe())
            console.print(loss.describe(), highlight=False)
        trainer = make_trainer(config, model, tokenizer, rows, out, callbacks, extras)
        initial = modeling.adapter_state(trainer.model) if config.lora.enabled else {}
        before = None if config.lora.enabled else weight_update.weight_sample(trainer.model)
        trainer.train(resume_from_checkpoint=resume)
        stopped = watch.stopped if watch else None
        if guard.diverged is None and stopped is None:  # a diverged run's NaN weights, a stopped one's, are no result
            save_final(trainer, tokenizer, config, out, adapter_base(config, starting))
        metrics = [json.loads(line) for line in (out / METRICS).read_text().splitlines()] if (out / METRICS).exists() else []
        summary = run_summary(config, starting, trainer, metrics, before=before, params=(trainable, total),
                              lineage=lineage, mirror=mirror, seconds=round(time.time() - started, 1),
                              diverged=guard.diverged, templates=template_record(config, tokenizer, loss), watch=watch)
        report_run(trainer, config, out, summary, metrics)
    if guard.diverged is not None or stopped is not None:
        raise RufusError(summary["warning"])
    console.print(f"[green]stage {config.stage} done[/]: {trainer.state.global_step} steps, output in {out}")
    return RunResult(out, trainer.state.global_step, metrics, trainable, total, initial, trainer)


def refuse_launched_stage(config: StageConfig) -> None:
    """A stage that needs processes started on their GPUs (`rufus-train stage` starts them) cannot
    train in this one."""
    reason = launch.launch_reason(config)
    if reason:
        raise RufusError(
            f"stage {config.stage} asks for {reason}: run it with `rufus-train stage {config.stage} ...`, which "
            "starts the trainer process(es) on their GPUs; this call trains in this process (a pipeline runs its "
            "stages in one process too)"
        )


def load_policy(config: StageConfig, starting: ModelRef, model, tokenizer, columns: list[str]):
    """(model, tokenizer) to train: those passed in, else loaded from `starting`; the stage's
    `chat_template:` set on the tokenizer, and a conversational stage without any refused before
    the model loads; seeded, then LoRA put on when the stage asks for it."""
    from transformers import set_seed  # heavy: transformers loads with the run

    if tokenizer is None:
        tokenizer = modeling.load_tokenizer(starting, config.chat_template)
    elif config.chat_template:
        tokenizer.chat_template = read_chat_template(config.chat_template, Path.cwd(), "chat_template")
    if not tokenizer.chat_template and set(columns) & CONVERSATION_COLUMNS:
        raise RufusError(f"model {config.model} has no chat template (a base model ships none), and stage {config.stage} "
                         "renders conversations: set `chat_template:` in the stage config (a shipped name: rufus_chatml, or "
                         "a family TRL stores such as qwen2_5; or a .jinja file)")
    if "prompt" in columns and "messages" not in columns:  # TRL renders the prompt alone, with the generation prompt
        check_prompt_render(tokenizer, f"model {config.model}")
    if model is None and config.lora.continue_adapter:  # the run's adapter, trained further on its base
        set_seed(config.seed)
        return modeling.continue_adapter(starting, config.dtype, config.lora), tokenizer
    if model is None:  # full fine-tuning loads fp32 master weights wherever the trainer autocasts (modeling.precision)
        model = modeling.load_model(starting, config.dtype, full_finetune=not config.lora.enabled)
    resize = fit_embeddings(model, len(tokenizer))  # added special tokens get rows (the Tulu 3 notebook's resize)
    if resize:
        console.print(f"note: {resize.note(config.lora.enabled)}", style="yellow", highlight=False, markup=False,
                      soft_wrap=True)
    set_seed(config.seed)  # the LoRA initialisation too: two runs of one seed (a resumed one's reference) agree
    if config.lora.enabled:
        model = modeling.apply_lora(model, config.lora)
    return model, tokenizer


def template_record(config: StageConfig, tokenizer, loss: LossMask | None) -> dict:
    """run.json's record of the chat template the run trained and saved with, and its loss mask."""
    template = tokenizer.chat_template if isinstance(tokenizer.chat_template, str) else None
    return {"chat_template": chat_template_record(template, config.chat_template or "model") if template else None,
            "loss_mask": loss.record() if loss else None}


def make_trainer(config: StageConfig, model, tokenizer, rows, out: Path, callbacks: list, extras: dict | None):
    """The stage's trainer over its dataset and TRL arguments, with the run's callbacks."""
    stage = get_stage(config.stage)
    dataset = stage.build_dataset(config, rows, tokenizer)
    ctx = StageContext(config=config, model=model, tokenizer=tokenizer, args=build_trl_args(config, out),
                       train_dataset=dataset, output_dir=out, callbacks=callbacks, extras=dict(extras or {}))
    stage.prepare(ctx)
    trainer = stage.make_trainer(ctx)
    from transformers import PrinterCallback

    # Off a terminal (no bar) transformers printed each step's log dict beside the step line
    # (step_progress.py): every step twice. metrics.jsonl and train.log keep the whole dict.
    trainer.remove_callback(PrinterCallback)
    if os.environ.get(TEST_HOOKS):  # tests only: record batches, stop after a save (tests/resume_hooks.py)
        importlib.import_module(os.environ[TEST_HOOKS]).install(trainer)
    if config.lora.enabled:
        modeling.check_only_adapter_trainable(trainer.model)
    return trainer


def run_summary(config: StageConfig, starting: ModelRef, trainer, metrics: list[dict], *, before,
                params: tuple[int, int], lineage: dict, mirror: Mirror | None, seconds: float, templates: dict,
                diverged: dict | None = None, watch=None) -> dict:
    """run.json's record of what trained, with a warning when the weights barely moved (`before`:
    a sample of the weights before training, full fine-tuning only), or when training diverged
    (`diverged`: where, from divergence.DivergenceGuard; then no model was saved); `templates`:
    template_record. A stage's `watch` (Stage.watch: GRPO's dead groups) gives the warning it
    measured first, and its record (`dead_groups`)."""
    moved = None if diverged else weight_update.measure(trainer.model, config.lora.enabled, before)
    measured, signal = watch.closing(metrics) if watch else (None, None)
    warning = (divergence_message(diverged, config.stage) if diverged else
               measured or weight_update.barely_moved_warning(moved, metrics, trainer.state.global_step, signal))
    return {
        "stage": config.stage,
        "model": config.model,
        "base_model": starting.portable,
        "data": config.data,
        "lineage": lineage,  # what the data was made from, and what it was checked against
        "lora": config.lora.model_dump() if config.lora.enabled else None,
        **templates,  # the chat template saved with the model, and which tokens trained (template_record)
        # of the trained weights (a merge uses it)
        "dtype": modeling.precision(config.dtype, full_finetune=not config.lora.enabled).dtype,
        "precision": modeling.precision_report(trainer),  # what trained: weights, autocast, optimizer dtypes
        "global_step": trainer.state.global_step,
        "resumed_from": config.resume_from_checkpoint,
        "checkpoint_mirror": mirror.report() if mirror else None,
        "trainable_params": params[0],
        "total_params": params[1],
        "final_metrics": metrics[-1] if metrics else {},
        "weight_update": moved,
        "diverged": diverged,
        "dead_groups": signal,  # GRPO: steps whose groups all had equal rewards, the share, the reward mean, the cause
        "stopped": bool(watch and watch.stopped),
        "warning": warning,
        "seconds": seconds,
        "versions": package_versions("torch", "transformers", "trl", "peft", "accelerate"),
    }


def report_run(trainer, config: StageConfig, out: Path, summary: dict, metrics: list[dict]) -> None:
    """The finished run's files (curves, model card, run.json last) and table, written by the main
    process, pushed when asked; its warning said on every process; its tracker runs closed."""
    if trainer.is_world_process_zero():
        curves = write_train_curves(out, metrics)
        write_model_card(out, summary)
        write_run_json(out, summary)
        print_result(summary_table(out, summary, metrics))
        if curves:
            print_result(f"curves: {curves}")
        if config.push_to_hub and not summary["diverged"] and not summary["stopped"]:  # after Rufus's card (TRL's own push is routed here)
            push_run(out, config.push_to_hub, config.push_private, config.push_merged)
    if summary["warning"] and not summary["diverged"] and not summary["stopped"]:  # those end with it as their error
        log.warning(summary["warning"])
        console.print(f"[bold yellow]warning:[/] {summary['warning']}", highlight=False, soft_wrap=True)
    finish_tracker_runs(config.report_to)


def checkpoint_eval_callback(config: StageConfig):
    """The rufus-eval callback when `eval.eval_on_checkpoint` is on (every stage gets it)."""
    if not config.eval.eval_on_checkpoint:
        return None
    # the baseline is the starting model's own folder (under FSDP/ZeRO-3 no rank holds its full weights)
    return CheckpointEvalCallback(config.eval, starting_model=config.model, devices=config.devices)


def adapter_base(config: StageConfig, starting: ModelRef) -> ModelRef:
    """The model the saved adapter applies to: the starting model, or with `continue_adapter`
    the starting run's own base (the adapter was trained further, not stacked)."""
    return starting.base if config.lora.continue_adapter and starting.base else starting


def save_final(trainer, tokenizer, config: StageConfig, out: Path, base: ModelRef) -> None:
    """Save the adapter (or full model) and tokenizer; the adapter records its base model as a
    reference that loads anywhere (`smollm2-135m`, a hub id, an absolute folder), resolved when
    the run is loaded (rufus_train.modeling, rufus_data.models.merged_model)."""
    trainer.save_model(str(out))  # with the resolved base folder: peft reads its config, offline
    tokenizer.save_pretrained(str(out))
    if config.lora.enabled and trainer.is_world_process_zero():
        set_adapter_base(out, base.portable)


def finish_tracker_runs(report_to: list[str]) -> None:
    """One tracker run per stage: transformers leaves the W&B run open after training, so the next
    stage of a pipeline (same process) would log into it."""
    if "wandb" in report_to:
        import wandb

        if wandb.run is not None:
            wandb.finish()
