"""`rufus-train`: stage trainers on curated shards (TRL + peft). Thin wrappers over
rufus_train.{config,runner,pipeline,modeling,plan}; the tests call those directly.

Results (tables, the resolved config, paths) go to stdout, progress and notes to stderr. The
runner imports torch/transformers/peft (about 18 s on a small CPU), the stage registry and configs
about 1 s of pyarrow and rewards: they are imported inside the commands that need them, so --help,
`plan` and `export` stay quick."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.rule import Rule
from rich.table import Table

from rufus_data.base.borrowed_options import borrowed_options
from rufus_data.base.catalog_files import docs_page
from rufus_data.base.cli_options import (
    DRY_RUN_HELP,
    RENAMED_ATTRIBUTE,
    UNDERSCORES,
    CliApp,
    FormatOption,
    VersionOption,
    flag_option,
    model_options,
)
from rufus_data.base.console import cli_errors, console, print_result, print_rows
from rufus_data.base.env_report import env_command
from rufus_data.base.errors import RufusError
from rufus_data.base.yaml_config import model_from_options
from rufus_data.folders.output_lock import OutputLock
from rufus_data.generate.vllm_command import SERVER_MODULE, format_command, module_command
from rufus_data.models.reference import ModelRef
from rufus_data.sources.inputs import is_catalog
from rufus_train.data import check_columns, read_rows
from rufus_train.export import MERGE_NOT_NEEDED, ExportConfig, export_plan
from rufus_train.mask import LOSS_STYLE, loss_masks, render
from rufus_train.modeling import export_merged, load_tokenizer
from rufus_train.plan import GPU_PEAK_TFLOPS, PlanConfig, explain, plan
from rufus_train.serve import ServeConfig, exec_server, exposure_notes, serve_command, serve_config
from rufus_train.trl_spellings import TRL_SPELLINGS

app = CliApp(spelling=UNDERSCORES, help="Rufus training stages on curated shards.",
             context_settings={"help_option_names": ["-h", "--help"]})  # -h as TRL's argparse CLI takes it
OVERRIDES = {"allow_extra_args": True, "ignore_unknown_options": True}
PYTHON_RENAMED = (f"--python PY is now --vllm_command \"PY -m {SERVER_MODULE}\" (the server command itself, as "
                  "rufus-data's vllm backend takes it); --python still works for now")


@app.callback()
def main(version: VersionOption = False) -> None:
    """Keep subcommands explicit."""


app.command("env")(env_command)


@app.command("stages")
@cli_errors
def stages_cmd(fmt: FormatOption = "table") -> None:
    """List the stages, one line each: name, what it does, its TRL config class."""
    from rufus_train.stages import all_stages  # every stage module: pyarrow, the rewards (about 1 s)

    rows = [(name, stage.description, stage.config_class.trl_config) for name, stage in sorted(all_stages().items())]
    print_rows(["stage", "description", "trl_config"], rows, fmt, title="rufus-train stages")


def resolve_stage_config(name: str, config: Path | None, extra: list[str]):
    # with the registry: about 1 s
    from rufus_train.config_loading import load_stage_config, parse_cli_overrides
    from rufus_train.stages import get_stage

    stage = get_stage(name)
    return load_stage_config(name, stage.config_class, config, parse_cli_overrides(extra))


# typer keeps the line breaks of a help text's later paragraphs: each paragraph is one line here.
STAGE_HELP = (
    "Run one post-training stage: the keys of catalogs/stages/NAME.yaml, each overridable as `--key value` "
    "(the command line wins).\n\n"
    "`rufus-train stage NAME --help` lists the stage's keys with their type, default and description, e.g. "
    "`--data DIR` (shard folders or rufus-data catalogs; default: the stage's data catalog), `--max_steps 10`, "
    "`--lora.r 8`; a boolean key is a bare flag (`--overwrite`, `--no_packing`). `--trainer.warmup_steps 0.1` "
    "sets any field of the stage's TRL config that Rufus does not set itself; a TRL key written at the top level "
    "(`--warmup_steps 0.1`) is taken as that, and one Rufus sets is refused with the key to use.\n\n"
    "`--num_processes N --accelerate_config ddp|fsdp2|zero2|zero3|FILE` runs the stage in N processes: Rufus "
    f"starts `accelerate launch` itself ({docs_page('train.md')}, multi-GPU)."
)
STAGE_OPTIONS_WITH_VALUES = ("--config", "--show_mask", "--show-mask")


def stage_named(args: list[str], help_names: list[str]) -> str | None:
    """The stage NAME of a `stage ... --help` command line (its first argument that is no option
    nor an option's value), or None when the help is not asked for or names no stage."""
    args = args[:args.index("--")] if "--" in args else args
    if not set(args) & set(help_names):
        return None
    follows_option = False
    for arg in args:
        if not arg.startswith("-") and not follows_option:
            return arg
        follows_option = arg in STAGE_OPTIONS_WITH_VALUES
    return None


class StageCommand(app.command_class):
    """`rufus-train stage NAME --help` lists the stage's keys after the options (stage_help.py);
    the registry (TRL) loads only then, so `stage --help` stays as quick as any other help."""

    def parse_args(self, ctx, args):
        name = stage_named(list(args), ctx.help_option_names)
        if name:
            from rufus_train.stages import get_stage  # heavy: the stage registry, TRL

            try:
                get_stage(name)
            except RufusError as err:  # before the help, which would list no keys
                console.print(f"[bold red]error:[/] {escape(str(err))}", highlight=False, soft_wrap=True)
                ctx.exit(2)
        ctx.meta["rufus_stage_help"] = name
        return super().parse_args(ctx, args)

    def format_help(self, ctx, formatter):
        super().format_help(ctx, formatter)
        if ctx.meta.get("rufus_stage_help"):
            from rufus_train.stage_help import print_stage_keys

            print_stage_keys(ctx.meta["rufus_stage_help"])


STAGE_DRY_RUN_HELP = f"{DRY_RUN_HELP}; the plan: every key of the stage, resolved"


@app.command("stage", cls=StageCommand, context_settings=OVERRIDES, help=STAGE_HELP)
@cli_errors
@borrowed_options(TRL_SPELLINGS)
def stage_cmd(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="stage name (see `rufus-train stages`); with --help: its keys")],
    config: Annotated[Path | None, typer.Option("--config", help="stage YAML (default catalogs/stages/NAME.yaml)")] = None,
    dry_run: Annotated[bool, flag_option("--dry-run", STAGE_DRY_RUN_HELP)] = False,
    show_mask: Annotated[int, typer.Option("--show-mask", help="print N rendered examples, loss tokens highlighted")] = 0,
) -> None:
    """Run one stage (--help: STAGE_HELP)."""
    from rufus_train.config_loading import resolved_yaml  # the stage registry: about 1 s
    from rufus_train.launch import launch_command, run_launch, wants_launch
    from rufus_train.stages import check_config

    cfg = resolve_stage_config(name, config, list(ctx.args))
    if dry_run:
        check_config(cfg)
        typer.echo(resolved_yaml(cfg), nl=False)
        print_model_check(cfg.model, cfg.chat_template)
        console.print("[green]config valid[/]: nothing was loaded or trained (drop --dry_run to run)")
        return
    if show_mask:
        print_masks(cfg, show_mask)
        return
    if wants_launch(cfg):
        check_config(cfg)  # refused here, before any process starts
        with OutputLock(cfg.output_dir, f"rufus-train stage {name}"):  # held here: the launched processes take none
            code = run_launch(launch_command(name, cfg, config, list(ctx.args)))
        if code:
            raise typer.Exit(code)
        return
    check_config(cfg)  # a typo'd model or missing data answered before the runner's imports (torch: 10-70 s)
    from rufus_train.runner import run_stage

    run_stage(cfg)


def print_model_check(model: str, chat_template: str | None) -> None:
    """`rufus-data models check`'s table for the model a dry run would train, on stderr (stdout
    stays the YAML); read from the model's small files, so a model not here yet is only named."""
    from rufus_data.models.check import COLUMNS, dry_run_check

    rows = dry_run_check(model, chat_template)
    if rows is None:
        console.print(f"model check: {model} is not here yet (a hub id, a built-in not yet converted); "
                      f"`rufus-data models check {model}` fetches and reads it", highlight=False, markup=False)
        return
    table = Table(title=f"model check: {model}")
    for column in COLUMNS:
        table.add_column(column)
    for row in rows:
        table.add_row(*row)
    console.print(table, highlight=False, markup=False)


def print_masks(cfg, n: int) -> None:
    from rufus_data.models.loss_mask import decide_loss_mask
    from rufus_train.stage_base import conversational  # heavy: pyarrow

    if not hasattr(cfg, "assistant_only_loss"):
        raise RufusError(f"--show_mask applies to the sft and midtrain stages (stage {cfg.stage} has no token mask)")
    if any(is_catalog(d) for d in cfg.data):
        raise RufusError("--show_mask reads shard folders: build the catalog first (`rufus-data mix CATALOG`)")
    check_columns(cfg.data, ("messages",), cfg.stage)
    tokenizer = load_tokenizer(cfg.model, cfg.chat_template)
    rows = read_rows(cfg.data, None, cfg.seed, cfg.stage).slice(0, n)
    loss = decide_loss_mask(tokenizer, f"model {cfg.model}") if cfg.assistant_only_loss else None
    if loss is not None:
        print_result(loss.describe())
    tools = rows.column("tools").to_pylist() if "tools" in rows.column_names else None
    for i, example in enumerate(loss_masks(tokenizer, conversational(rows, "messages"), loss, cfg.max_length, tools)):
        print_result(Rule(f"example {i}: {example.trained_tokens} of {len(example.input_ids)} tokens carry loss"))
        print_result(render(tokenizer, example))
    mode = "assistant turns only" if cfg.assistant_only_loss else "every token"
    print_result(f"[{LOSS_STYLE}]highlighted[/] tokens carry loss ({mode}); dim ones are context")


@app.command("pipeline")
@cli_errors
def pipeline_cmd(
    file: Annotated[Path, typer.Argument(help="catalogs/pipelines/NAME.yaml")],
    dry_run: Annotated[bool, flag_option(
        "--dry-run", f"{DRY_RUN_HELP}; the plan: every stage's resolved config, the evaluation and the merge")] = False,
    model: Annotated[str | None, typer.Option(
        "--model", help="the base model the first stage trains (instead of the file's `model:`)")] = None,
) -> None:
    """Run stages in order, each from the previous output; print a quick evaluation after each."""
    from rufus_train.pipeline import dry_run as pipeline_dry_run  # heavy: the stages import TRL and peft
    from rufus_train.pipeline import load_pipeline, run_pipeline, stage_configs

    pipeline = load_pipeline(file, model)
    if dry_run:
        print_result(pipeline_dry_run(pipeline), end="", markup=False, highlight=False)
        print_model_check(pipeline.model, stage_configs(pipeline, notes=[])[0].chat_template)
        console.print("[green]pipeline valid[/]: nothing was loaded or trained (drop --dry_run to run)")
        return
    run_pipeline(pipeline)


@app.command("export")
@cli_errors
@model_options(ExportConfig)
def export_cmd(
    dry_run: Annotated[bool, flag_option(
        "--dry-run", f"{DRY_RUN_HELP}; the plan: the adapter, its base, the merged folder and the copy")] = False,
    merge: Annotated[bool, typer.Option("--merge", hidden=True, metavar="", help=MERGE_NOT_NEEDED)] = False,
    options: dict | None = None,
) -> None:
    """Merge a run's LoRA adapter into a copy of its base: a plain model folder for inference.
    RUN/merged is made once and reused (rufus-eval makes and reads the same folder)."""
    if merge:
        console.print(f"note: {MERGE_NOT_NEEDED}", style="yellow", highlight=False, markup=False, soft_wrap=True)
    config = model_from_options(ExportConfig, options)
    if dry_run:
        print_result("\n".join(export_plan(config)), markup=False, highlight=False)
        console.print("[green]export valid[/]: nothing was loaded or written (drop --dry_run to export)")
        return
    run = ModelRef.of(config.run)
    target = export_merged(run, config.out, overwrite=config.overwrite)
    console.print(
        f"[green]exported[/] {target}: the LoRA adapter of {config.run} merged into a copy of its base "
        f"{run.base.text} (the base model itself is unchanged).\n"
        f"The trained behaviour lives in the adapter: loading the base model alone does NOT include it; "
        f"load {target} (or base + adapter) instead.",
        soft_wrap=True, highlight=False,
    )
    print_result(str(target))


@app.command("plan")
@cli_errors
@model_options(PlanConfig)
def plan_cmd(options: dict | None = None) -> None:
    """GPUs needed: 6ND FLOPs over (mfu x peak bf16 x time), as the Smol playbook computes it."""
    settings = model_from_options(PlanConfig, options)
    params, tokens, days, mfu = settings.params, settings.tokens, settings.days, settings.mfu
    p = plan(params, tokens, days, mfu, settings.gpu)
    for line in explain(p):
        typer.echo(line)
    table = Table(title="same run on other GPUs (dense bf16 peak)")
    for col in ("gpu", "peak TFLOP/s", "GPUs"):
        table.add_column(col, justify="right")
    for name, peak in GPU_PEAK_TFLOPS.items():
        other = plan(params, tokens, days, mfu, name)
        table.add_row(name, f"{peak:g}", str(other.gpus), style="bold" if name == p.gpu else None)
    print_result(table)
    typer.echo(f"{p.gpus} GPUs ({p.gpu})")


@app.command("prefetch")
@cli_errors
def prefetch_cmd() -> None:
    """Fetch what async GRPO downloads on first use (its FlashAttention tree-attention kernel, through
    `kernels`) into the cache, for a GPU machine that trains offline: run it there while online."""
    from rufus_train.grpo.attention_kernel import prefetch  # torch: only for this command

    name, path = prefetch()
    table = Table(title="prefetched for async GRPO (HF_HUB_OFFLINE=1 runs read it from the cache)")
    for col in ("what", "cached at"):
        table.add_column(col)
    table.add_row(name, str(path))
    print_result(table)


def old_option_name(old: str, new: str, because: str):
    """Decorator: `old` still parses as the command's own option `new`, with a note saying why."""
    def mark(command):
        renamed = {**getattr(command, RENAMED_ATTRIBUTE, {}), old: (new, because)}
        setattr(command, RENAMED_ATTRIBUTE, renamed)
        return command
    return mark


@app.command("serve")
@cli_errors
@model_options(ServeConfig)
@old_option_name("--print", "--dry-run", "one --dry_run in every command; it prints the server's command")
def serve_cmd(
    dry_run: Annotated[bool, flag_option(
        "--dry-run", f"{DRY_RUN_HELP}; the plan: the server's command line and environment")] = False,
    python: Annotated[str | None, typer.Option("--python", hidden=True, help=PYTHON_RENAMED)] = None,
    options: dict | None = None,
) -> None:
    """Start the vLLM server async GRPO needs (weight-transfer routes, processed logprobs, NCCL, bf16)."""
    if python:
        console.print(f"note: {PYTHON_RENAMED}", style="yellow", highlight=False, markup=False, soft_wrap=True)
        options = {"vllm_command": module_command(python), **(options or {})}  # --vllm_command wins
    config = serve_config(options or {})
    if dry_run:
        env, argv = serve_command(config, dry_run=True)
        typer.echo(format_command(env, argv))
        for note in exposure_notes(config):
            console.print(note, highlight=False, soft_wrap=True)
        console.print("[green]server valid[/]: nothing was started or loaded (drop --dry_run to start it)")
        return
    exec_server(config)


if __name__ == "__main__":  # `accelerate launch -m rufus_train.cli stage ...`
    app()
