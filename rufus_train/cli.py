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
from rich.rule import Rule
from rich.table import Table

from rufus_data.cli_options import CliApp, OverwriteOption, VersionOption
from rufus_data.console import cli_errors, console, print_result
from rufus_data.env_report import env_command
from rufus_data.errors import RufusError
from rufus_data.generate.vllm_command import format_command
from rufus_data.inputs import is_catalog
from rufus_data.merged_model import adapter_base
from rufus_data.output_lock import OutputLock
from rufus_train.data import check_columns, read_rows
from rufus_train.mask import LOSS_STYLE, loss_mask, render
from rufus_train.modeling import export_merged, load_tokenizer
from rufus_train.plan import GPU_PEAK_TFLOPS, explain, plan
from rufus_train.serve import DEFAULT_MAX_MODEL_LEN, ServeSpec, exec_server, serve_command, spec_for_stage

app = CliApp(help="Rufus training stages on curated shards.")
OVERRIDES = {"allow_extra_args": True, "ignore_unknown_options": True}


@app.callback()
def main(version: VersionOption = False) -> None:
    """Keep subcommands explicit."""


app.command("env")(env_command)


@app.command("stages")
@cli_errors
def stages_cmd() -> None:
    """List the stages, one line each."""
    from rufus_train.stages import all_stages  # every stage module: pyarrow, the rewards (about 1 s)

    table = Table(title="rufus-train stages")
    table.add_column("stage", style="bold")
    table.add_column("what it does")
    for name, stage in sorted(all_stages().items()):
        table.add_row(name, stage.description)
    print_result(table)


def resolve_stage_config(name: str, config: Path | None, extra: list[str]):
    from rufus_train.config import load_stage_config, parse_cli_overrides  # with the registry: about 1 s
    from rufus_train.stages import get_stage

    stage = get_stage(name)
    return load_stage_config(name, stage.config_class, config, parse_cli_overrides(extra))


# typer keeps the line breaks of a help text's later paragraphs: each paragraph is one line here.
STAGE_HELP = (
    "Run one post-training stage: the keys of catalogs/stages/NAME.yaml, each overridable as `--key value` "
    "(the command line wins).\n\n"
    "Any key of the stage YAML is an option here, e.g. `--data DIR` (shard folders or rufus-data catalogs; "
    "default: the stage's data catalog), `--max_steps 10`, `--lora.r 8`, `--trainer.warmup_steps 0.1` (any field "
    "of the TRL config); a boolean key is a bare flag (`--overwrite`, `--no-packing`). To see a stage's keys: the "
    "stage YAML lists each with its default and what it does, and `rufus-train stage NAME --dry-run` prints them "
    "all resolved.\n\n"
    "`--num_processes N --accelerate_config ddp|fsdp2|zero2|zero3|FILE` runs the stage in N processes: Rufus "
    "starts `accelerate launch` itself (docs/train.md, multi-GPU)."
)


@app.command("stage", context_settings=OVERRIDES, help=STAGE_HELP)
@cli_errors
def stage_cmd(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="stage name (see `rufus-train stages`)")],
    config: Annotated[Path | None, typer.Option("--config", help="stage YAML (default catalogs/stages/NAME.yaml)")] = None,
    dry_run: Annotated[bool, typer.Option(
        "--dry-run", help="validate and print every key of the stage with its resolved value; load nothing")] = False,
    show_mask: Annotated[int, typer.Option("--show-mask", help="print N rendered examples, loss tokens highlighted")] = 0,
) -> None:
    """Run one stage (--help: STAGE_HELP)."""
    from rufus_train.config import resolved_yaml  # heavy: the runner and stages import TRL and peft
    from rufus_train.launch import launch_command, run_launch, wants_launch
    from rufus_train.runner import check_config, run_stage

    cfg = resolve_stage_config(name, config, list(ctx.args))
    if dry_run:
        check_config(cfg)
        typer.echo(resolved_yaml(cfg), nl=False)
        console.print("[green]config valid[/]: nothing was loaded or trained (drop --dry-run to run)")
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
    run_stage(cfg)


def print_masks(cfg, n: int) -> None:
    from rufus_train.stage_base import conversational  # heavy: pyarrow

    if not hasattr(cfg, "assistant_only_loss"):
        raise RufusError(f"--show-mask applies to the sft and midtrain stages (stage {cfg.stage} has no token mask)")
    if any(is_catalog(d) for d in cfg.data):
        raise RufusError("--show-mask reads shard folders: build the catalog first (`rufus-data mix CATALOG`)")
    check_columns(cfg.data, ("messages",), cfg.stage)
    tokenizer = load_tokenizer(cfg.model)
    rows = read_rows(cfg.data, None, cfg.seed, cfg.stage).slice(0, n)
    for i, messages in enumerate(conversational(rows, "messages")):
        example = loss_mask(tokenizer, messages, cfg.assistant_only_loss, cfg.max_length)
        print_result(Rule(f"example {i}: {example.trained_tokens} of {len(example.input_ids)} tokens carry loss"))
        print_result(render(tokenizer, example))
    mode = "assistant turns only" if cfg.assistant_only_loss else "every token"
    print_result(f"[{LOSS_STYLE}]highlighted[/] tokens carry loss ({mode}); dim ones are context")


@app.command("pipeline")
@cli_errors
def pipeline_cmd(
    file: Annotated[Path, typer.Argument(help="catalogs/pipelines/NAME.yaml")],
    dry_run: Annotated[bool, typer.Option(
        "--dry-run", help="print every stage's resolved config, as `stage --dry-run` does; load nothing")] = False,
) -> None:
    """Run stages in order, each from the previous output; print a quick evaluation after each."""
    from rufus_train.pipeline import dry_run as pipeline_dry_run  # heavy: the stages import TRL and peft
    from rufus_train.pipeline import load_pipeline, run_pipeline

    pipeline = load_pipeline(file)
    if dry_run:
        print_result(pipeline_dry_run(pipeline), end="", markup=False, highlight=False)
        console.print("[green]pipeline valid[/]: nothing was loaded or trained (drop --dry-run to run)")
        return
    run_pipeline(pipeline)


@app.command("export")
@cli_errors
def export_cmd(
    run: Annotated[Path, typer.Argument(help="a run folder holding a LoRA adapter")],
    merge: Annotated[bool, typer.Option(
        "--merge", help="merge the adapter into a copy of its base (Rufus exports merged models; the adapter alone "
        "is already in RUN)")],
    out: Annotated[Path | None, typer.Option(
        "--out", help="also copy the merged model here (default: RUN/merged only, the copy rufus-eval uses too)")] = None,
    overwrite: OverwriteOption = False,
) -> None:
    """Merge a run's LoRA adapter into a copy of its base: a plain model folder for inference.
    RUN/merged is made once and reused (rufus-eval makes and reads the same folder)."""
    target = export_merged(run, out, overwrite=overwrite)
    console.print(
        f"[green]exported[/] {target}: the LoRA adapter of {run} merged into a copy of its base "
        f"{adapter_base(run)} (the base model itself is unchanged).\n"
        f"The trained behaviour lives in the adapter: loading the base model alone does NOT include it; "
        f"load {target} (or base + adapter) instead.",
        soft_wrap=True, highlight=False,
    )
    print_result(str(target))


@app.command("plan")
@cli_errors
def plan_cmd(
    params: Annotated[float, typer.Option("--params", help="model parameters N, e.g. 3e9")],
    tokens: Annotated[float, typer.Option("--tokens", help="training tokens D, e.g. 1.1e13")],
    days: Annotated[float, typer.Option("--days", help="wall-clock days available")],
    mfu: Annotated[float, typer.Option("--mfu", help="model FLOPs utilisation (0.3-0.5 typical)")] = 0.3,
    gpu: Annotated[str, typer.Option("--gpu", help="GPU kind: a100, h100, h200, b200, l40s, mi300x")] = "h100",
) -> None:
    """GPUs needed: 6ND FLOPs over (mfu x peak bf16 x time), as the Smol playbook computes it."""
    p = plan(params, tokens, days, mfu, gpu)
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


@app.command("serve")
@cli_errors
def serve_cmd(
    model: str | None = typer.Argument(
        None, help="model to serve: built-in name, model folder or hub id (default: the --stage's model)"),
    stage: str | None = typer.Option(
        None, "--stage", help="a GRPO stage whose config sets the model, devices.server, the port of vllm_server, "
        "the LoRA rank and max_staleness"),
    config: Path | None = typer.Option(None, "--config", help="with --stage: its YAML (default catalogs/stages/NAME.yaml)"),
    devices: str | None = typer.Option(
        None, "--devices", help="the server's physical GPU ids (CUDA_VISIBLE_DEVICES); never the trainer's "
        "[default: the stage's devices.server, else 1]"),
    port: int | None = typer.Option(None, "--port", help="[default: the stage's vllm_server port, else 8000]"),
    host: str = typer.Option("0.0.0.0", "--host"),
    max_model_len: int = typer.Option(DEFAULT_MAX_MODEL_LEN, "--max-model-len", help="prompt + completion tokens per request"),
    gpu_memory_utilization: float = typer.Option(0.9, "--gpu-memory-utilization"),
    lora_rank: int | None = typer.Option(
        None, "--lora-rank", help="serve LoRA adapters (adapter-only weight sync) [default: the stage's lora.r]"),
    max_staleness: int | None = typer.Option(
        None, "--max-staleness", help="with --lora-rank: adapter slots = this + 2 [default: the stage's, else 4]"),
    python: str | None = typer.Option(None, "--python", help="interpreter with vllm (default: this one)"),
    print_only: bool = typer.Option(False, "--print", help="print the command instead of running it"),
) -> None:
    """Start the vLLM server async GRPO needs (weight-transfer routes, processed logprobs, NCCL, bf16)."""
    given = {"devices": devices, "port": port, "host": host, "max_model_len": max_model_len,
             "gpu_memory_utilization": gpu_memory_utilization, "lora_rank": lora_rank,
             "max_staleness": max_staleness, "python": python}
    if stage is not None:
        spec = spec_for_stage(resolve_stage_config(stage, config, []), model=model, **given)
    elif model is None:
        raise RufusError("give the MODEL to serve, or --stage NAME (a GRPO stage: its model and devices.server)")
    else:
        spec = ServeSpec(model=model, **{k: v for k, v in given.items() if v is not None})
    if print_only:
        env, argv = serve_command(spec)
        typer.echo(format_command(env, argv))
        return
    exec_server(spec)


if __name__ == "__main__":  # `accelerate launch -m rufus_train.cli stage ...`
    app()
