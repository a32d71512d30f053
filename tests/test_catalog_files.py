"""Where catalogs are (rufus_data/base/catalog_files.py): the user's own catalogs/ first, then the
shipped ones; a missing catalog names both places; `rufus-data catalogs list / copy`; and the
version every output records (rufus_data/base/version.py), on the three CLIs with `env` beside it.
The installed wheel is tests/test_wheel.py's."""

from __future__ import annotations

import ast
import re
import subprocess
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from rufus_data.base.catalog_files import (
    catalog_file,
    copy_shipped,
    docs_page,
    is_shipped,
    resolve_entry,
    shipped_catalogs,
    shipped_root,
)
from rufus_data.base.errors import RufusError
from rufus_data.base.version import CodeVersion, code_version, rufus_version
from rufus_data.benchmarks.suite import known_suites, suite_path
from rufus_data.cli import app as data_app
from rufus_data.folders.shards import package_versions
from rufus_data.sources.inputs import data_input
from rufus_eval.cli import app as eval_app
from rufus_train.cli import app as train_app
from rufus_train.launch import accelerate_config_path

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def empty_folder(tmp_path, monkeypatch) -> Path:
    """A working folder outside the checkout, without catalogs of its own."""
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_from_a_checkout_the_shipped_catalogs_are_its_catalogs_folder():
    assert shipped_root() == REPO / "catalogs"
    listed = shipped_catalogs()
    assert {"stages/sft.yaml", "suites/quick.yaml", "benchmarks.yaml", "samples/rl_arithmetic.jsonl"} <= set(listed)
    assert "__init__.py" not in listed


def test_an_empty_folder_reads_the_shipped_catalogs(empty_folder):
    assert resolve_entry("catalogs/rl.yaml") == shipped_root() / "rl.yaml"
    assert catalog_file("stages/sft.yaml") == shipped_root() / "stages" / "sft.yaml"
    assert accelerate_config_path("ddp") == shipped_root() / "accelerate" / "ddp.yaml"
    assert suite_path("quick") == shipped_root() / "suites" / "quick.yaml"
    assert data_input("catalogs/data/sft_mixture.yaml").shipped  # a stage's default data


def test_the_users_own_catalogs_come_first(empty_folder):
    for relative in ("rl.yaml", "stages/sft.yaml", "accelerate/ddp.yaml", "suites/mine.yaml"):
        (empty_folder / "catalogs" / relative).parent.mkdir(parents=True, exist_ok=True)
        (empty_folder / "catalogs" / relative).write_text("# mine\n")
    assert resolve_entry("catalogs/rl.yaml") == Path("catalogs/rl.yaml")
    assert not data_input("catalogs/rl.yaml").shipped
    assert catalog_file("stages/sft.yaml") == Path("catalogs/stages/sft.yaml")
    assert accelerate_config_path("ddp") == Path("catalogs/accelerate/ddp.yaml").absolute()  # accelerate reads it elsewhere
    assert "mine" in known_suites() and "quick" in known_suites()
    assert catalog_file("stages/dpo.yaml") == shipped_root() / "stages" / "dpo.yaml"  # the rest stay shipped


def test_a_path_the_user_names_is_read_as_given(empty_folder):
    mine = empty_folder / "elsewhere" / "mix.yaml"
    mine.parent.mkdir()
    mine.write_text("# mine\n")
    assert resolve_entry(mine) == mine and not is_shipped(mine)
    assert resolve_entry("not-here.yaml") == Path("not-here.yaml")  # its reader reports it


def test_a_missing_catalog_names_both_places(empty_folder):
    with pytest.raises(RufusError) as err:
        resolve_entry("catalogs/data/nope.yaml")
    message = str(err.value)
    assert str(empty_folder / "catalogs" / "data" / "nope.yaml") in message
    assert str(shipped_root() / "data" / "nope.yaml") in message
    with pytest.raises(RufusError, match="no suite named 'nope'.*your catalogs.*shipped ones"):
        suite_path("nope")


def test_a_users_stage_config_is_what_the_stage_loads(empty_folder):
    from rufus_train.config_loading import load_stage_config
    from rufus_train.stages import get_stage

    copy_shipped("stages/sft.yaml")
    stage = empty_folder / "catalogs" / "stages" / "sft.yaml"
    raw = yaml.safe_load(stage.read_text())
    stage.write_text(yaml.safe_dump({**raw, "max_length": 77}))
    assert load_stage_config("sft", get_stage("sft").config_class).max_length == 77


def test_copy_starts_from_the_shipped_file_and_keeps_an_existing_one(empty_folder):
    runner = CliRunner()
    res = runner.invoke(data_app, ["catalogs", "copy", "stages/sft.yaml"])
    assert res.exit_code == 0, res.output
    copied = empty_folder / "catalogs" / "stages" / "sft.yaml"
    assert copied.read_bytes() == (shipped_root() / "stages" / "sft.yaml").read_bytes()
    copied.write_text("# edited\n")
    res = runner.invoke(data_app, ["catalogs", "copy", "stages/sft.yaml"])
    assert res.exit_code == 2 and "--overwrite" in res.output
    assert copied.read_text() == "# edited\n"
    assert runner.invoke(data_app, ["catalogs", "copy", "catalogs/stages/sft.yaml", "--overwrite"]).exit_code == 0
    assert copied.read_bytes() == (shipped_root() / "stages" / "sft.yaml").read_bytes()
    res = runner.invoke(data_app, ["catalogs", "copy", "suites/quick.yaml", "mine"])  # a folder that does not exist: a file
    assert res.exit_code == 0 and (empty_folder / "mine").read_bytes() == (shipped_root() / "suites/quick.yaml").read_bytes()
    res = runner.invoke(data_app, ["catalogs", "copy", "stages/nope.yaml"])
    assert res.exit_code == 2 and "catalogs list" in res.output


def test_list_names_every_shipped_catalog_and_what_overrides_it(empty_folder):
    copy_shipped("stages/dpo.yaml")
    res = CliRunner().invoke(data_app, ["catalogs", "list"])
    assert res.exit_code == 0, res.output
    rows = {line.split("│")[1].strip(): line.split("│")[2].strip() for line in res.output.splitlines()
            if line.startswith("│")}
    assert set(rows) == set(shipped_catalogs())
    assert rows["stages/dpo.yaml"] == "catalogs/stages/dpo.yaml" and rows["stages/sft.yaml"] == "shipped"


def test_a_checkout_reports_its_current_commit():
    head = subprocess.run(["git", "rev-parse", "HEAD"], check=False, cwd=REPO, capture_output=True, text=True)
    described = subprocess.run(["git", "describe", "--tags", "--exact-match"], check=False, cwd=REPO, capture_output=True)
    found = code_version()
    if head.returncode == 0 and described.returncode != 0:  # not at a release tag: the commit is named
        assert found.commit and head.stdout.startswith(found.commit)
    assert package_versions("pyarrow")["rufus"] == rufus_version() == found.version


def test_the_version_says_commit_and_dirty_as_setuptools_scm_wrote_them():
    assert CodeVersion.of("0.1.0") == CodeVersion("0.1.0", None, False)
    dev = CodeVersion.of("0.1.1.dev3+g1a2b3c4")
    assert (dev.commit, dev.dirty) == ("1a2b3c4", False)
    dirty = CodeVersion.of("0.1.1.dev3+g1a2b3c4.d20261203")
    assert (dirty.commit, dirty.dirty) == ("1a2b3c4", True)
    assert dirty.describe() == "rufus 0.1.1.dev3+g1a2b3c4.d20261203 (commit 1a2b3c4, uncommitted changes)"


@pytest.mark.parametrize("app", [data_app, train_app, eval_app], ids=["rufus-data", "rufus-train", "rufus-eval"])
def test_every_cli_has_version_env_and_completion(app):
    runner = CliRunner()
    res = runner.invoke(app, ["--version"])
    assert res.exit_code == 0 and res.output.strip() == code_version().describe()
    helptext = runner.invoke(app, ["--help"]).output
    assert "--install-completion" in helptext and "--show-completion" in helptext and " env " in helptext


def test_env_reports_what_a_bug_report_needs():
    res = CliRunner().invoke(data_app, ["env"])
    assert res.exit_code == 0, res.output
    for row in ("Rufus", "Python", "platform", "torch CUDA build", "GPUs seen", "transformers", "trl", "peft",
                "accelerate", "vllm", "lm_eval", "datasets"):
        assert f"│ {row} " in res.output, row
    assert code_version().version in res.output


def test_every_catalog_taking_command_reads_the_shipped_catalog_from_an_empty_folder(empty_folder):
    """Installed = cloned: a `catalogs/...` path the working folder lacks is the shipped file, for
    vibe's prompts, a suite path, a stage's --config, decontam's and dedup's --config and
    --benchmarks, as for mix."""
    from rufus_data.base.yaml_config import config_from_cli
    from rufus_data.benchmarks.registry import load_registry
    from rufus_data.dedup.config import DedupConfig
    from rufus_eval.vibe import load_prompts
    from rufus_train.config_loading import load_stage_config
    from rufus_train.stages import get_stage

    assert len(load_prompts(resolve_entry("catalogs/vibe_prompts.yaml"))) >= 3
    assert suite_path("catalogs/suites/quick.yaml") == shipped_root() / "suites" / "quick.yaml"
    config = load_stage_config("sft", get_stage("sft").config_class, config_file="catalogs/stages/sft.yaml")
    assert config.stage == "sft"
    assert load_registry("catalogs/benchmarks.yaml")[1] == shipped_root() / "benchmarks.yaml"
    dedup_file = empty_folder / "elsewhere.yaml"
    dedup_file.write_text("threshold: 0.9\n")
    (empty_folder / "catalogs").mkdir()
    (empty_folder / "catalogs" / "dedup.yaml").write_text("threshold: 0.7\n")  # the user's own catalogs come first
    assert config_from_cli(DedupConfig, "catalogs/dedup.yaml", {}).threshold == 0.7
    with pytest.raises(RufusError, match="looked in your catalogs"):
        config_from_cli(DedupConfig, "catalogs/nope.yaml", {})


def test_vibe_reads_the_shipped_prompts_from_an_empty_folder(empty_folder, monkeypatch):
    from rufus_eval import vibe

    asked = []
    monkeypatch.setattr(vibe, "answer_all", lambda ckpt, prompts, *args: asked.append(prompts) or
                        [[vibe.TurnReply("-", "p", "") for _ in p.user_turns] for p in prompts])
    res = CliRunner().invoke(eval_app, ["vibe", "catalogs/vibe_prompts.yaml", "--ckpt", "tiny-random"])
    assert res.exit_code == 0, res.output
    assert len(asked[0]) >= 3 and (empty_folder / "vibe.html").is_file()


def test_env_prints_the_data_root_the_cache_and_the_offline_switches(monkeypatch, tmp_path):
    monkeypatch.setenv("RUFUS_DATA_ROOT", "/data/here")
    monkeypatch.setenv("RUFUS_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    res = CliRunner().invoke(data_app, ["env"], env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    rows = {line.split("│")[1].strip(): line.split("│")[2].strip() for line in res.output.splitlines()
            if line.startswith("│")}
    assert rows["RUFUS_DATA_ROOT"] == "/data/here" and rows["HF_HUB_OFFLINE"] == "1"
    assert rows["RUFUS_CACHE"] == f"{tmp_path / 'cache'} -> {tmp_path / 'cache'}"
    assert rows["HF_DATASETS_OFFLINE"] == rows["TRANSFORMERS_OFFLINE"] == "(not set)"


def test_env_constraints_prints_the_tested_versions():
    for app in (data_app, train_app, eval_app):
        res = CliRunner().invoke(app, ["env", "--constraints"])
        assert res.exit_code == 0, res.output
        assert res.stdout == (REPO / "constraints.txt").read_text()


def _docstrings(tree) -> set[int]:
    """ids of the docstring constants of a module and its classes and functions."""
    found = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
            found.add(id(body[0].value))
    return found


def test_messages_and_help_cite_docs_the_user_has():
    """A wheel has no docs/ folder beside the user: every string a user reads (help, messages,
    reports) names a docs page through docs_page, which gives the installed copy there."""
    literal = []
    for path in sorted(p for package in ("rufus_data", "rufus_train", "rufus_eval") for p in (REPO / package).rglob("*.py")):
        tree = ast.parse(path.read_text())
        skip = _docstrings(tree)
        literal += [f"{path.relative_to(REPO)}:{node.lineno}" for node in ast.walk(tree)
                    if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip
                    and re.search(r"docs/\w+\.md", node.value)]
    assert not literal, f"strings naming docs/PAGE.md literally (use docs_page): {literal}"
    assert docs_page("decontam.md") == str((REPO / "docs" / "decontam.md").relative_to(Path.cwd())) \
        if REPO in Path.cwd().parents or REPO == Path.cwd() else str(REPO / "docs" / "decontam.md")


def test_installed_the_docs_are_the_packaged_copy(monkeypatch, tmp_path):
    from rufus_data.base import catalog_files

    installed = tmp_path / "site" / "rufus_docs"  # as the wheel installs it
    installed.mkdir(parents=True)
    (installed / "train.md").write_text("# train\n")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.setattr(catalog_files, "source_checkout", lambda: None)
    catalog_files.docs_root.cache_clear()
    try:
        monkeypatch.chdir(tmp_path / "site")
        assert docs_page("train.md") == "rufus_docs/train.md"  # under the working folder: relative
        monkeypatch.chdir(REPO)
        assert docs_page("train.md") == str(installed / "train.md")  # anywhere else: the whole path
    finally:
        catalog_files.docs_root.cache_clear()
