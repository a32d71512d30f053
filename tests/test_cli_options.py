"""Options generated from pydantic config models (rufus_data/base/cli_options.py): every field of the
shared generation settings is a flag of both `filter` and `pairs`, with its description as help;
booleans are bare flags; required fields are required options. Nothing here generates."""

from __future__ import annotations

from typing import Annotated, Literal

import pytest
import typer
from pydantic import BaseModel, Field
from typer.main import get_command
from typer.testing import CliRunner

from rufus_data.base.cli_options import (
    HYPHENS,
    UNDERSCORES,
    CliApp,
    Flag,
    accept_both_spellings,
    model_options,
    respell,
)
from rufus_data.cli import app
from rufus_data.rollouts.filter import FilterConfig
from rufus_data.rollouts.options import GenerationOptions
from rufus_data.rollouts.pairs import PairsConfig

COMMANDS = {"filter": FilterConfig, "pairs": PairsConfig}
# the flags the two commands had when each declared its own options: none may go away
FLAGS_BEFORE = {
    "--out", "--policy", "--reward", "--k", "--backend", "--max-tokens", "--temperature", "--top-p", "--top-k",
    "--min-p", "--repetition-penalty", "--seed", "--base-url", "--served-model-name", "--concurrency",
    "--vllm-command", "--devices", "--max-model-len", "--overwrite",
}
FLAGS_BEFORE_FILTER = FLAGS_BEFORE | {"--keep", "--from-rollouts"}
FLAGS_BEFORE_PAIRS = FLAGS_BEFORE | {"--strong", "--weak", "--perturb-answer", "--require-verified",
                                     "--strong-base-url", "--weak-base-url"}


def options_of(command: str) -> dict:
    return {p.name: p for p in get_command(app).commands[command].params}


def help_lines(command_app, *args) -> list[str]:
    result = CliRunner().invoke(command_app, [*args, "--help"], terminal_width=200)
    assert result.exit_code == 0, result.output
    return result.output.splitlines()


@pytest.mark.parametrize("command", COMMANDS)
def test_every_generation_setting_is_a_flag_with_its_description(command):
    config, options = COMMANDS[command], options_of(command)
    for name in GenerationOptions.model_fields:
        assert name in options, f"{command} has no option for GenerationOptions.{name}"
        assert options[name].help == config.model_fields[name].description
    for name in config.model_fields:  # the command's own settings too
        assert options[name].help == config.model_fields[name].description
    flags = {flag for option in options.values() for flag in option.opts}
    assert flags >= (FLAGS_BEFORE_FILTER if command == "filter" else FLAGS_BEFORE_PAIRS)


def test_defaults_come_from_each_commands_config():
    filter_options, pairs_options = options_of("filter"), options_of("pairs")
    assert (filter_options["temperature"].default, pairs_options["temperature"].default) == (1.0, 0.7)
    assert (filter_options["k"].default, pairs_options["k"].default) == (8, 4)
    assert filter_options["keep"].default == "0<p<1" and filter_options["concurrency"].default == 32


def test_boolean_options_are_bare_flags_in_help():
    lines = help_lines(app, "pairs") + help_lines(app, "filter")
    for flag in ("--overwrite", "--perturb-answer", "--require-verified"):
        shown = [line for line in lines if f" {flag} " in line]
        assert shown, f"{flag} missing from --help"
        assert all("<bool>" not in line for line in shown), shown
    # --out is optional since the commands got a default folder (outputs/<input name>-filtered, -pairs);
    # the [required] mark of a required field is checked on Settings below
    assert any(" --out " in line for line in lines)
    shown = " ".join(" ".join(lines).replace("│", " ").split())
    assert "(default: outputs/<input name>-filtered)" in shown and "(default: outputs/<input name>-pairs)" in shown


class Settings(BaseModel):
    name: str = Field(description="who to greet")
    loud: bool = Field(False, description="shout")
    polite: bool = Field(True, description="say please")
    urls: Annotated[list[str], Flag("--url", metavar="URL")] = Field(default_factory=list, description="where, repeatable")
    words: Annotated[list[str] | None, Flag(type=str, parse=str.split)] = Field(None, description="a phrase")
    times: int = Field(1, ge=1, description="how often")


def settings_app(seen: dict) -> typer.Typer:
    demo = typer.Typer()

    @demo.command()
    @model_options(Settings)
    def greet(dry: bool = typer.Option(False, "--dry"), options: dict | None = None) -> None:
        seen.update(options=options, dry=dry)

    @demo.command()
    def other() -> None:  # two commands keep typer from folding `greet` into the app itself
        pass

    return demo


def test_generated_options_parse_into_the_field_values():
    seen: dict = {}
    demo = settings_app(seen)
    result = CliRunner().invoke(demo, ["greet", "--name", "ada", "--loud", "--no-polite", "--url", "a", "--url", "b",
                                       "--words", "hello there", "--dry"])
    assert result.exit_code == 0, result.output
    assert seen == {"dry": True, "options": {"name": "ada", "loud": True, "polite": False, "urls": ["a", "b"],
                                             "words": ["hello", "there"], "times": 1}}
    assert CliRunner().invoke(demo, ["greet", "--name", "ada"]).exit_code == 0
    assert seen["options"] == {"name": "ada", "loud": False, "polite": True, "times": 1}  # unset lists are absent
    missing = CliRunner().invoke(demo, ["greet"])
    assert missing.exit_code == 2 and "--name" in missing.output
    lines = help_lines(demo, "greet")
    assert any("--name" in line and "[required]" in line for line in lines)
    assert any("--polite" in line and "--no-polite" in line for line in lines)
    assert all("<bool>" not in line for line in lines if "--loud" in line)


def test_a_field_without_description_or_declared_twice_is_refused():
    class Bare(BaseModel):
        x: int = 1

    with pytest.raises(ValueError, match="Bare.x has no description"):
        model_options(Bare)
    with pytest.raises(ValueError, match=r"declares \['name'\] itself and through Settings"):

        @model_options(Settings)
        def clash(name: str = "x", options: dict | None = None) -> None:
            pass


def test_a_bad_value_is_named_as_its_option(tmp_path):
    result = CliRunner().invoke(app, ["pairs", str(tmp_path), "--out", str(tmp_path / "p"), "--perturb-answer",
                                      "--k", "0"])
    assert result.exit_code == 2 and "--k: Input should be greater than or equal to 1" in result.output
    assert not (tmp_path / "p").exists()


def spelled_app(spelling: str, seen: dict) -> CliApp:
    demo = CliApp(spelling=spelling)

    @demo.command("greet")
    @model_options(Settings)
    def greet(dry_run: bool = typer.Option(False, "--dry-run", help="plan only"), options: dict | None = None) -> None:
        seen.update(options=options, dry_run=dry_run)

    @demo.command("other")
    def other() -> None:
        """A second command keeps `greet` a subcommand."""

    return demo


@pytest.mark.parametrize("spelling", [HYPHENS, UNDERSCORES])
def test_both_spellings_parse_and_help_shows_the_clis_own(spelling):
    seen: dict = {}
    demo = spelled_app(spelling, seen)
    for args in (["--name", "ada", "--dry-run", "--no-polite", "--url", "a"],
                 ["--name=ada", "--dry_run", "--no_polite", "--url", "a"]):
        result = CliRunner().invoke(demo, ["greet", *args])
        assert result.exit_code == 0, result.output
        assert seen == {"dry_run": True, "options": {"name": "ada", "loud": False, "polite": False, "urls": ["a"],
                                                     "times": 1}}
    shown = " ".join(help_lines(demo, "greet"))
    own, other = ("--dry-run", "--dry_run") if spelling == HYPHENS else ("--dry_run", "--dry-run")
    assert own in shown and other not in shown
    assert "VALUE..." in shown or "URL..." in shown  # a list reads as values, not <list[str]>
    assert "<list" not in shown
    unknown = CliRunner().invoke(demo, ["greet", "--name", "ada", "--nmae_x", "1"])
    assert unknown.exit_code == 2  # an option in neither spelling is still refused


def test_accept_both_spellings_leaves_values_and_what_follows_a_double_dash():
    known = {"--max-tokens", "--base-url"}
    assert accept_both_spellings(["--max_tokens", "8", "--base_url=http://a_b", "--", "--max_tokens"], known) == [
        "--max-tokens", "8", "--base-url=http://a_b", "--", "--max_tokens"]
    assert respell("--no-lora-enabled", UNDERSCORES) == "--no_lora_enabled" and respell("-k", UNDERSCORES) == "-k"


def test_a_required_boolean_is_refused():
    class Required(BaseModel):
        merge: bool = Field(description="merge")

    with pytest.raises(ValueError, match="Required.merge is a required boolean"):
        model_options(Required)


def test_the_no_model_loads_guard_catches_a_load(no_model_loads, tiny_model):
    """The guard the --dry-run tests rely on fails on a real load (it can fail)."""
    import transformers
    from conftest import ModelLoaded

    with pytest.raises(ModelLoaded, match="from_pretrained"):
        transformers.AutoModelForCausalLM.from_pretrained(tiny_model)
    with pytest.raises(ModelLoaded, match="from_pretrained"):
        transformers.LlamaForCausalLM.from_pretrained(tiny_model)
    transformers.AutoTokenizer.from_pretrained(tiny_model)  # a plan may count tokens


def test_aliases_parse_silently_and_old_names_with_a_note():
    class Renamed(BaseModel):
        tasks: Annotated[list[str], Flag("--tasks", aliases=("--task",))] = Field(default_factory=list, description="t")
        repeats: Annotated[int, Flag(old_names=("--samples",), renamed_because="lm-eval's --samples picks documents")] = (
            Field(1, description="k"))

    seen: dict = {}
    demo = CliApp(spelling=UNDERSCORES)

    @demo.command("run")
    @model_options(Renamed)
    def run(options: dict | None = None) -> None:
        seen.update(options)

    @demo.command("other")
    def other() -> None:
        """A second command keeps `run` a subcommand."""

    result = CliRunner().invoke(demo, ["run", "--task", "a", "--tasks", "b", "--samples", "4"])
    assert result.exit_code == 0, result.output
    assert seen == {"tasks": ["a", "b"], "repeats": 4}
    said = " ".join(result.output.split())
    assert "note: --samples is now --repeats (lm-eval's --samples picks documents); --samples still works" in said
    assert "--task " not in said  # an alias parses without a note
    shown = " ".join(help_lines(demo, "run"))
    assert "--repeats" in shown and "--samples" not in shown and "--task " not in shown


def test_a_list_of_choices_shows_and_checks_them():
    """typer takes no list of a Literal: the choices are shown as one choice is, and each value checked."""

    class Tracked(BaseModel):
        trackers: list[Literal["wandb", "trackio"]] = Field(default_factory=list, description="where to log")

    seen: dict = {}
    demo = CliApp()

    @demo.command("run")
    @model_options(Tracked)
    def run(options: dict | None = None) -> None:
        seen.update(options)

    @demo.command("other")
    def other() -> None:
        """A second command keeps `run` a subcommand."""

    assert CliRunner().invoke(demo, ["run", "--trackers", "wandb", "--trackers", "trackio"]).exit_code == 0
    assert seen == {"trackers": ["wandb", "trackio"]}
    refused = CliRunner().invoke(demo, ["run", "--trackers", "tensorboard"])
    assert refused.exit_code == 2 and "'tensorboard' is not one of wandb, trackio" in refused.output
    assert any("--trackers" in line and "<wandb|trackio>..." in line for line in help_lines(demo, "run"))


def test_layered_options_hold_only_what_the_command_line_gives():
    """Options over a config file (`layered`): one left out is absent (the file keeps its value), a
    boolean can be set either way, --help still shows the model's defaults, in their own panel;
    stacked with the command's own model, each dict gets its own fields."""

    class Knobs(BaseModel):
        ngram: int = Field(8, description="n-gram length")
        semantic: bool = Field(False, description="also embed")
        engine: Literal["local", "ray"] = Field("local", description="where it runs")

    class Own(BaseModel):
        shards: Annotated[str, Flag(argument=True)] = Field(description="the folder")
        report_only: bool = Field(False, description="write nothing")

    seen: dict = {}
    demo = CliApp()

    @demo.command("run")
    @model_options(Knobs, into="knobs", layered=True, panel="Knobs (keys of --config FILE)")
    @model_options(Own, into="own")
    def run(own: dict | None = None, knobs: dict | None = None) -> None:
        seen.update(own=own, knobs=knobs)

    @demo.command("other")
    def other() -> None:
        """A second command keeps `run` a subcommand."""

    for args, knobs in ((["x"], {}), (["x", "--ngram", "8"], {"ngram": 8}), (["x", "--no-semantic"], {"semantic": False}),
                        (["x", "--semantic", "--engine", "ray"], {"semantic": True, "engine": "ray"})):
        result = CliRunner().invoke(demo, ["run", *args])
        assert result.exit_code == 0, result.output
        assert seen == {"own": {"shards": "x", "report_only": False}, "knobs": knobs}, args
    shown = " ".join(help_lines(demo, "run"))
    assert "Knobs (keys of --config FILE)" in shown and "[default: 8]" in shown and "<local|ray>" in shown
    assert "--semantic" in shown and "--no-semantic" in shown
    assert CliRunner().invoke(demo, ["run", "x", "--engine", "spark"]).exit_code == 2
