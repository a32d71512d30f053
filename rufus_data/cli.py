"""`rufus-data`: thin typer commands over the library functions (tests call those directly)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from rufus_data.base.cli_options import (
    DRY_RUN_HELP,
    CliApp,
    FormatOption,
    OverwriteOption,
    VersionOption,
    flag_option,
    model_options,
)
from rufus_data.base.console import cli_errors, console, exit_on_sigterm, print_result, print_rows
from rufus_data.base.env_report import env_command
from rufus_data.base.errors import RufusError
from rufus_data.base.yaml_config import config_from_cli, model_from_options
from rufus_data.decontam.config import DecontamCommand, DecontamConfig
from rufus_data.dedup.config import DedupCommand, DedupConfig
from rufus_data.mix.config import MixCommand, MixConfig
from rufus_data.models.builtin import list_models, pull
from rufus_data.rollouts.options import FilterConfig, PairsConfig

app = CliApp(help="Rufus data: mix sources into token-balanced shards, decontam them against benchmarks, dedup, "
                  "filter RL prompts by pass rate, build preference pairs; inspect, sql and push a shard folder; "
                  "the built-in models, the shipped catalogs and the cache.")
models_app = CliApp(help="Model references and the built-in small model.")
app.add_typer(models_app, name="models")
catalogs_app = CliApp(help="The catalogs Rufus ships (stages, suites, data catalogs, samples): list them, copy one to edit.")
app.add_typer(catalogs_app, name="catalogs")
cache_app = CliApp(help="What $RUFUS_CACHE holds, and removing its computed entries.")
app.add_typer(cache_app, name="cache")


@app.callback()
def main(version: VersionOption = False) -> None:
    """Keep subcommands explicit even while there is only one; every command unwinds on SIGTERM
    (its temporary folder and lock go)."""
    exit_on_sigterm()


app.command("env")(env_command)


@models_app.command("list")
@cli_errors
def models_list(fmt: FormatOption = "table") -> None:
    """List the built-in models and whether they are converted in the cache."""
    columns = ["name", "cached", "path", "source", "description"]
    print_rows(columns, [tuple(row[c] for c in columns) for row in list_models()], fmt, title="built-in models")


@models_app.command("pull")
@cli_errors
def models_pull(name: str = typer.Argument("smollm2-135m", help="built-in model name")) -> None:
    """Download, check and convert a built-in model into the cache ($RUFUS_CACHE); prints its folder."""
    print_result(str(pull(name)), highlight=False)


@models_app.command("check")
@cli_errors
def models_check(
    model: str = typer.Argument(..., help="built-in name, model folder, run folder or hub id"),
    chat_template: str | None = typer.Option(
        None, "--chat-template", help="a stage's `chat_template:` (shipped name or .jinja file) instead of the model's"),
    fmt: FormatOption = "table",
) -> None:
    """What a run will make of MODEL, from its small files: template source, loss mask route, end
    tokens, thinking switch, vocabulary against embedding rows."""
    from rufus_data.models.check import COLUMNS, check_model

    print_rows(COLUMNS, check_model(model, chat_template), fmt, title=f"model check: {model}")


@catalogs_app.command("list")
@cli_errors
def catalogs_list() -> None:
    """List the shipped catalogs, and which of them your ./catalogs/ overrides (yours are read first)."""
    from rufus_data.base.catalog_files import find_catalog_file, shipped_catalogs, shipped_root

    table = Table(title=f"shipped catalogs ({shipped_root()})")
    for col in ("catalog", "read from"):
        table.add_column(col)
    for name in shipped_catalogs():
        found = find_catalog_file(name)
        table.add_row(name, "shipped" if found == shipped_root() / name else str(found))
    print_result(table)


@catalogs_app.command("copy")
@cli_errors
def catalogs_copy(
    name: str = typer.Argument(..., help="a shipped catalog as `catalogs list` names it, e.g. stages/sft.yaml"),
    dest: Path = typer.Argument(None, help="file or folder to copy to (default: ./catalogs/NAME, read before the shipped one)"),
    overwrite: OverwriteOption = False,
) -> None:
    """Copy a shipped catalog out to edit it; an existing file is kept unless --overwrite."""
    from rufus_data.base.catalog_files import copy_shipped

    print_result(str(copy_shipped(name, dest, overwrite=overwrite)), highlight=False)


@cache_app.command("info")
@cli_errors
def cache_info() -> None:
    """List each folder of the cache: files, size, and the computed entries `cache clean` removes."""
    from rufus_data.base import cache
    from rufus_data.base.paths import cache_dir

    root = cache_dir()
    table = Table(title=f"cache {root} (computed entries bounded by ${cache.MAX_GB_VARIABLE}: "
                        f"{cache.max_bytes() / 1e9:g} GB)")
    for col in ("folder", "files", "MB", "computed entries", "computed MB"):
        table.add_column(col, justify="left" if col == "folder" else "right")
    for folder in cache.info(root):
        table.add_row(folder.name, str(folder.files), f"{folder.size / 1e6:,.1f}", str(folder.computed),
                      f"{folder.computed_size / 1e6:,.1f}")
    print_result(table)


@cache_app.command("clean")
@cli_errors
def cache_clean() -> None:
    """Remove the computed entries (decontam eval indexes: rebuilt when next needed); models and wheels stay."""
    from rufus_data.base import cache
    from rufus_data.base.paths import cache_dir

    entries, size = cache.clean(cache_dir())
    print_result(f"removed {entries} computed entries ({size / 1e6:,.1f} MB) from {cache_dir()}; converted models "
                 "and downloaded wheels are kept", highlight=False)


@app.command("mix")
@cli_errors
@model_options(MixConfig, into="settings")
@model_options(MixCommand, into="command")
def mix_command(command: dict | None = None, settings: dict | None = None) -> None:
    """Mix sources by token share into parquet shards with a manifest and a report."""
    given = model_from_options(MixCommand, command)
    config = model_from_options(MixConfig, settings)
    if given.dry_run:
        from rufus_data.mix.plan import mix_plan, print_mix_plan  # heavy: arrow, the tokenizer

        print_mix_plan(mix_plan(given.catalog, given.out, config, overwrite=given.overwrite, show_progress=True))
        return
    from rufus_data.mix import mix  # heavy: arrow and the tokenizer, not for --help
    from rufus_data.mix.selection import print_sources

    result = mix(given.catalog, given.out, config, overwrite=given.overwrite, show_progress=True)
    manifest = result.manifest
    print_sources(f"mix {manifest['name']}: {manifest['rows']['train']:,} rows", manifest["sources"], manifest["notes"],
                  manifest["basis"])
    console.print(f"wrote {result.out} ({manifest['rows']['train']:,} rows): see {result.out / 'report.md'}")


@app.command("inspect")
@cli_errors
def inspect_command(
    folder: Path = typer.Argument(..., help="shard folder written by rufus-data"),
    as_json: bool = typer.Option(False, "--json", help="print the findings as JSON"),
) -> None:
    """Rows and tokens per source and label, a token-length histogram, and data-bug warnings
    (all on stdout: they are what was asked for)."""
    from rufus_data.shard_inspect import inspect_shards, to_json  # heavy: duckdb and arrow, not for --help

    found = inspect_shards(folder)
    if as_json:
        typer.echo(to_json(found))
        return
    table = Table(title=f"{folder}: rows and tokens")
    for col in ("source", "label", "rows", "tokens", "trainable"):
        table.add_column(col, justify="left" if col in ("source", "label") else "right")
    for r in found.per_source:
        table.add_row(r["source"], r["label"], f"{r['rows']:,}", f"{r['tokens'] or 0:,}", f"{r['trainable'] or 0:,}")
    print_result(table)
    if found.loss_mask:
        print_result(f"trainable tokens: assistant tokens of chat template {found.loss_mask['chat_template']}, found by "
                     f"route {found.loss_mask['route']}", highlight=False)
    if found.histogram:
        peak = max(n for _, _, n in found.histogram)
        print_result("[bold]token length histogram[/]")
        for lo, hi, n in found.histogram:
            print_result(f"{lo:>7,}-{hi:<7,} {'█' * max(1, round(40 * n / peak))} {n:,}", highlight=False)
    if found.modes:
        modes = Table(title="reasoning modes (the system prompt's tag)")
        for col in ("mode", "rows", "multi-turn", "reasoned every turn"):
            modes.add_column(col, justify="left" if col == "mode" else "right")
        for m in found.modes:
            modes.add_row(m["mode"], f"{m['rows']:,}", f"{m['multi_turn']:,}", f"{m['reasoned_every_turn']:,}")
        print_result(modes)
    for warning in found.warnings:
        print_result(f"[yellow]warning:[/] {warning}", highlight=False)
    if not found.warnings:
        print_result("[green]no data-bug warnings[/]")


@app.command("sql")
@cli_errors
def sql_command(
    folder: Path = typer.Argument(..., help="shard folder"),
    query: str = typer.Argument(..., help="SQL over the views train (alias shards) and holdout"),
    fmt: FormatOption = "table",
) -> None:
    """Run a DuckDB query over a shard folder; the rows go to stdout."""
    from rufus_data.shard_inspect import run_sql  # heavy: duckdb and arrow, not for --help

    print_rows(*run_sql(folder, query), fmt)


# --- generation: filter and pairs (rufus_data/rollouts/) ----------------
# Their options are the fields of FilterConfig / PairsConfig, one flag each (cli_options.py); the
# commands themselves load arrow, an HTTP client and a model, so they are imported when they run.
InputsArgument = Annotated[list[Path], typer.Argument(
    help="rl shard folder(s), or catalog(s) to mix first (default: catalogs/rl.yaml)", show_default=False)]


GENERATION_DRY_RUN = ("prompts (after --limit) x samples x --max-tokens, the backend `auto` picks, each source's "
                      "reward, the output folder; a catalog input is counted, not mixed")


@app.command("filter")
@cli_errors
@model_options(FilterConfig, optional=("policy",))  # --from-rollouts needs none
def filter_command(
    inputs: InputsArgument = None,
    out: Path = typer.Option(None, "--out", help="output folder (default: outputs/<input name>-filtered)"),
    from_rollouts: Path = typer.Option(None, "--from-rollouts", help="re-bucket an earlier filter --out (no generation)"),
    overwrite: OverwriteOption = False,
    dry_run: Annotated[bool, flag_option("--dry-run", f"{DRY_RUN_HELP}: {GENERATION_DRY_RUN}")] = False,
    options: dict | None = None,
) -> None:
    """Sample k completions per RL prompt, score them, and bucket prompts into all_pass/ learnable/
    all_fail/ unscored/ (resumable; rollouts.parquet, report.md)."""
    keep = options.get("keep", FilterConfig.model_fields["keep"].default)
    if from_rollouts is not None:
        if out is None:
            raise RufusError("--from-rollouts DIR needs --out: the folder for the re-bucketed output")
        if dry_run:
            from rufus_data.rollouts.plan import rebucket_plan  # heavy: arrow

            rebucket_plan(from_rollouts, out, keep, overwrite=overwrite)
            return
        from rufus_data.rollouts.filter import rebucket  # heavy: arrow, the generation backends

        result = rebucket(from_rollouts, out, keep, overwrite=overwrite, aggregation=options.get("aggregation"))
    else:
        if "policy" not in options:
            raise RufusError("filter needs --policy MODEL: the model whose samples decide the buckets "
                             "(e.g. --policy smollm2-135m), or --from-rollouts DIR to re-bucket an earlier run")
        config = model_from_options(FilterConfig, options)
        if dry_run:
            from rufus_data.rollouts.plan import filter_plan, print_generation_plan  # heavy: arrow

            print_generation_plan(filter_plan(inputs, out, config, overwrite=overwrite))
            return
        from rufus_data.rollouts.filter import filter_prompts  # heavy: arrow, the generation backends

        result = filter_prompts(inputs, out, config, overwrite=overwrite, show_progress=True)
    print_rows(["bucket", "prompts"], [(bucket, f"{count:,}") for bucket, count in result.counts.items()],
               title=f"{result.out}: prompts per bucket")
    console.print(f"wrote {result.out}: see {result.out / 'report.md'}")


@app.command("pairs")
@cli_errors
@model_options(PairsConfig)
def pairs_command(
    inputs: InputsArgument = None,
    out: Path = typer.Option(None, "--out", help="output folder (default: outputs/<input name>-pairs)"),
    overwrite: OverwriteOption = False,
    dry_run: Annotated[bool, flag_option("--dry-run", f"{DRY_RUN_HELP}: {GENERATION_DRY_RUN}; how pairs are built")] = False,
    options: dict | None = None,
) -> None:
    """Preference pairs (TRL conversational format): strong vs weak, on-policy, or perturbed answers."""
    config = model_from_options(PairsConfig, options)
    if dry_run:
        from rufus_data.rollouts.plan import pairs_plan, print_generation_plan  # heavy: arrow, the tokenizer

        print_generation_plan(pairs_plan(inputs, out, config, overwrite=overwrite))
        return
    from rufus_data.rollouts.pairs import build_pairs  # heavy: arrow, the generation backends

    result = build_pairs(inputs, out, config, overwrite=overwrite, show_progress=True)
    rows = [(name, f"{value:,}" if isinstance(value, int) else str(value)) for name, value in result.counts.items()]
    rows.append(("chosen/rejected length ratio", str(result.manifest["chosen_rejected_length_ratio"])))
    print_rows(["count", "value"], rows, title=f"{result.out}: {result.manifest['method']}")
    console.print(f"wrote {result.out}: see {result.out / 'report.md'}")


# --- decontam and dedup (rufus_data/decontam/, rufus_data/dedup/) ----------
# Two models each: the command's own settings (what it reads and writes) and the step's config,
# whose options go on top of --config FILE (an option left out keeps the file's value).
SETTINGS_PANEL = "Settings (the keys of --config FILE; an option given here overrides the file)"


@app.command("decontam")
@cli_errors
@model_options(DecontamConfig, into="settings", layered=True, panel=SETTINGS_PANEL)
@model_options(DecontamCommand, into="command")
def decontam_command(command: dict | None = None, settings: dict | None = None) -> None:
    """Find training rows that contain benchmark items (exact n-grams + MinHash; + embeddings with --semantic) and drop them."""
    given = model_from_options(DecontamCommand, command)
    config = config_from_cli(DecontamConfig, given.config, settings)
    how = {"overwrite": given.overwrite, "report_only": given.report_only}
    if given.dry_run:
        from rufus_data.decontam.plan import decontam_plan, print_decontam_plan  # heavy: arrow

        print_decontam_plan(decontam_plan(given.shards, given.out, config, **how))
        return
    from rufus_data.decontam import decontam  # heavy: arrow, datasketch
    from rufus_data.decontam.hits_page import HITS_PAGE
    from rufus_data.decontam.report import summary_table

    result = decontam(given.shards, given.out, config, **how, show_progress=True)
    print_result(summary_table(result))
    for name, why in result.missing.items():
        console.print(f"[yellow]skipped[/] {name}: {why}", highlight=False)
    for task, why in result.not_decontaminable.items():
        console.print(f"[yellow]not checked[/] {task}: {why}", highlight=False)
    if result.out is None:
        console.print("report only: nothing written")
        return
    console.print(f"wrote {result.out}: see {result.out / 'report.md'} and {result.out / HITS_PAGE} (every hit beside "
                  "its benchmark item, in a browser)", highlight=False, soft_wrap=True)


@app.command("dedup")
@cli_errors
@model_options(DedupConfig, into="settings", layered=True, panel=SETTINGS_PANEL)
@model_options(DedupCommand, into="command")
def dedup_command(command: dict | None = None, settings: dict | None = None) -> None:
    """Drop near-duplicate rows within a mix (MinHash + LSH; + embeddings with --semantic), keeping the first of each cluster."""
    given = model_from_options(DedupCommand, command)
    config = config_from_cli(DedupConfig, given.config, settings)
    how = {"overwrite": given.overwrite, "report_only": given.report_only}
    if given.dry_run:
        from rufus_data.dedup.plan import dedup_plan, print_dedup_plan  # heavy: arrow

        print_dedup_plan(dedup_plan(given.shards, given.out, config, **how))
        return
    from rufus_data.dedup import dedup  # heavy: arrow, datasketch
    from rufus_data.dedup.report import summary_table

    result = dedup(given.shards, given.out, config, **how, show_progress=True)
    for warning in result.warnings:
        console.print(f"[yellow]warning:[/] {warning}", highlight=False)
    if result.nothing_removed:
        console.print(f"[yellow]note:[/] {result.nothing_removed}", highlight=False)
    print_result(summary_table(result))
    console.print(f"wrote {result.out}: see {result.out / 'report.md'}" if result.out else "report only: nothing written")


@app.command("push")
@cli_errors
def push_command(
    out: Path = typer.Argument(..., help="an output folder of mix, decontam, dedup, filter or pairs"),
    repo_id: str = typer.Argument(..., help="the dataset repo, ORG/NAME (created when missing)"),
    public: bool = typer.Option(False, "--public", help="create the repo public (default: private)"),
) -> None:
    """Upload an output folder as a Hub dataset repo (its card makes `load_dataset(ORG/NAME)` load it as the step means); the token from HF_TOKEN or `hf auth login`."""
    from rufus_data.folders.hub_push import push_data_folder

    print_result(push_data_folder(out, repo_id, private=not public))
