"""Rufus installed, not cloned: the wheel built from this checkout, installed into a fresh virtual
environment whose dependencies are borrowed from the test environment (a .pth line naming its
site-packages: seconds, not a second full install), runs the README's commands from an empty
folder outside the checkout. Each writes where the user is and nothing into the installed package."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.spawn

REPO = Path(__file__).resolve().parents[1]
BUILD_LEFTOVERS = ("build", "rufus.egg-info")  # what an in-tree setuptools build leaves in the checkout


def _build(args: list[str]) -> str:
    """A pip build in the checkout, removing the build folders it leaves there (gitignored, but an
    egg-info on sys.path would pose as an installed Rufus); returns what the build printed."""
    existing = {name for name in BUILD_LEFTOVERS if (REPO / name).exists()}
    try:
        done = subprocess.run([sys.executable, "-m", "pip", "-v", *args], cwd=REPO, check=True, capture_output=True,
                              text=True, timeout=300)
        return done.stdout + done.stderr
    finally:
        for name in set(BUILD_LEFTOVERS) - existing:
            shutil.rmtree(REPO / name, ignore_errors=True)


def _fresh_venv(folder: Path) -> Path:
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(folder)], check=True, timeout=60)
    site = next(folder.glob("lib/python*/site-packages"))
    (site / "borrowed.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return folder


def _pip_into(venv: Path, *args: str) -> str:
    """Install into `venv`; what pip and the build backend printed (-v: setuptools' own lines)."""
    return _build(["--python", str(venv / "bin" / "python"), "install", "--no-deps", "--no-build-isolation", *args])


def _package_files(site: Path) -> dict[Path, tuple[int, int]]:
    """Each installed file (compiled bytecode aside) with its size and modification time."""
    return {p: (p.stat().st_size, p.stat().st_mtime_ns) for name in ("rufus_data", "rufus_train", "rufus_eval", "rufus_catalogs")
            for p in (site / name).rglob("*") if "__pycache__" not in p.parts}


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """(wheel, venv, the user's empty folder, the environment the commands run in)."""
    work = tmp_path_factory.mktemp("wheel")
    printed = _build(["wheel", "--no-deps", "--no-build-isolation", "-w", str(work / "dist"), "."])
    assert "would be ignored" not in printed  # setuptools' banner: every file of the wheel is package data it names
    wheel = next((work / "dist").glob("rufus-*.whl"))
    venv = _fresh_venv(work / "venv")
    _pip_into(venv, str(wheel))
    user = work / "user"
    user.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # the checkout must not be importable
    env.update(PATH=f"{venv / 'bin'}{os.pathsep}{env['PATH']}", HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1")
    return wheel, venv, user, env


def run_installed(installed, *argv: str, timeout: int = 240) -> subprocess.CompletedProcess:
    """One command of the installed Rufus, in the user's folder: it succeeds and leaves the package as installed."""
    _, venv, user, env = installed
    site = next(venv.glob("lib/python*/site-packages"))
    before = _package_files(site)
    res = subprocess.run(argv, check=False, cwd=user, env=env, capture_output=True, text=True, timeout=timeout)
    assert res.returncode == 0, f"{' '.join(argv)}\n{res.stdout}\n{res.stderr}"
    assert _package_files(site) == before, "the command wrote into the installed package"
    return res


def wheel_version(wheel: Path) -> str:
    return wheel.name.split("-")[1]


def test_the_wheel_ships_the_catalogs(installed):
    wheel = installed[0]
    names = zipfile.ZipFile(wheel).namelist()
    shipped = {n.removeprefix("rufus_catalogs/") for n in names if n.startswith("rufus_catalogs/")}
    tracked = subprocess.run(["git", "ls-files", "catalogs"], cwd=REPO, capture_output=True, text=True, check=True)
    expected = {Path(p).relative_to("catalogs").as_posix() for p in tracked.stdout.split()}
    assert expected and shipped == expected  # every tracked catalog file, samples and __init__.py included


def test_the_wheel_ships_the_docs_the_constraints_and_the_chat_template(installed):
    names = set(zipfile.ZipFile(installed[0]).namelist())
    docs = {f"rufus_docs/{p.name}" for p in (REPO / "docs").glob("*.md")}
    assert docs and docs <= names
    assert {"rufus_docs/constraints.txt", "rufus_data/models/templates/rufus_chatml.jinja"} <= names
    printed = run_installed(installed, "rufus-data", "env", "--constraints").stdout
    assert printed == (REPO / "constraints.txt").read_text()


def test_vibe_reads_the_shipped_prompts(installed):
    _, _, user, _ = installed
    run_installed(installed, "rufus-eval", "vibe", "catalogs/vibe_prompts.yaml", "--ckpt", "tiny-random",
                  "--max-tokens", "2")
    assert (user / "vibe.html").is_file()


def test_version_is_the_wheels_and_names_the_commit(installed):
    wheel = installed[0]
    out = run_installed(installed, "rufus-data", "--version").stdout
    assert out.split()[:2] == ["rufus", wheel_version(wheel)]
    head = subprocess.run(["git", "rev-parse", "HEAD"], check=False, cwd=REPO, capture_output=True, text=True).stdout.strip()
    if "+g" in wheel_version(wheel):  # a commit after a release tag: setuptools-scm names it
        assert f"commit {head[:7]}" in out


def test_mix_of_a_shipped_catalog_writes_in_the_users_folder(installed):
    wheel, venv, user, _ = installed
    run_installed(installed, "rufus-data", "mix", "catalogs/sft.yaml")
    manifest = json.loads((user / "outputs" / "sft" / "manifest.json").read_text())
    assert manifest["versions"]["rufus"] == wheel_version(wheel)
    assert manifest["rows"]["train"] > 0
    shipped = next(venv.glob("lib/python*/site-packages")) / "rufus_catalogs" / "sft.yaml"
    assert Path(manifest["catalog"]["path"]) == shipped  # the user has no catalogs/: the shipped one


def test_stage_dry_run_reads_the_shipped_stage(installed):
    res = run_installed(installed, "rufus-train", "stage", "sft", "--dry-run")
    assert res.stdout.startswith("stage: sft\n") and "- catalogs/data/sft_mixture.yaml" in res.stdout
    assert "config valid" in res.stderr


def test_eval_suite_quick_on_tiny_random(installed):
    wheel, _, user, _ = installed
    run_installed(installed, "rufus-eval", "suite", "quick", "--ckpt", "tiny-random", "--limit", "1",
                  "--repeats", "1", "--max-tokens", "16", "--out", "eval-run")
    record = json.loads((user / "eval-run" / "results.json").read_text())
    assert {t["status"] for t in record["tasks"].values()} == {"ran"}
    assert record["versions"]["rufus"] == wheel_version(wheel)


def test_filter_on_tiny_random_reads_the_shipped_rl_catalog(installed):
    _, _, user, _ = installed
    run_installed(installed, "rufus-data", "filter", "--policy", "tiny-random", "--limit", "2", "--k", "2",
                  "--max-tokens", "8", "--out", "filtered")
    manifest = json.loads((user / "filtered" / "manifest.json").read_text())
    assert sum(manifest["counts"][b] for b in ("all_pass", "learnable", "all_fail", "unscored")) == 2


def test_an_editable_install_maps_rufus_catalogs_onto_the_checkout(tmp_path):
    """And its --version asks setuptools-scm about the checkout (with the build's settings: its
    metadata holds a .devN version, which must not be taken for a tag to bump)."""
    venv = _fresh_venv(tmp_path / "venv")
    printed = _pip_into(venv, "-e", ".")
    assert "running " in printed and "would be ignored" not in printed  # setuptools ran, without its banner
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    res = subprocess.run([str(venv / "bin" / "python"), "-c",
                          "import importlib.resources as r; print(r.files('rufus_catalogs') / 'stages')"],
                         check=False, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert Path(res.stdout.strip()).resolve() == (REPO / "catalogs" / "stages").resolve()
    version = subprocess.run([str(venv / "bin" / "rufus-data"), "--version"], check=False, cwd=tmp_path, env=env,
                             capture_output=True, text=True, timeout=60)
    head = subprocess.run(["git", "rev-parse", "HEAD"], check=True, cwd=REPO, capture_output=True, text=True).stdout
    assert version.returncode == 0, version.stderr
    assert version.stdout.startswith("rufus ") and (f"commit {head[:7]}" in version.stdout or "+g" not in version.stdout)
