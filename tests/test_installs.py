"""Installs that resolve and stay reproducible: the `gpu` extra asks for the vLLM releases the
installed TRL supports, every install the Makefile makes is constrained to constraints.txt (the
versions CI last tested, which satisfy pyproject.toml), and CI checks that the GPU install
resolves before it runs the tests (scripts/check_resolve.sh, a pip dry run; not run here: it
needs the package index)."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import tomllib
from importlib.metadata import requires
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parents[1]


def project() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text())["project"]


def pins() -> dict[str, str]:
    lines = [line for line in (REPO / "constraints.txt").read_text().splitlines() if line and not line.startswith("#")]
    bad = [line for line in lines if not re.fullmatch(r"[A-Za-z0-9._-]+==[0-9][0-9A-Za-z.!-]*", line)]
    assert not bad, f"constraints.txt lines that are not NAME==VERSION (no local label, no URL): {bad[:5]}"
    return {canonicalize_name(name): v for name, v in (line.split("==") for line in lines)}


def test_gpu_extra_asks_for_the_vllm_releases_trl_supports():
    """vllm and deepspeed come through TRL's own extras (their ranges are TRL's), kernels below
    transformers' cap, and the train and eval extras beside them: what bench/gpu_smoke.sh needs."""
    gpu = [Requirement(r) for r in project()["optional-dependencies"]["gpu"]]
    trl = next(r for r in gpu if r.name == "trl")
    assert {"vllm", "deepspeed"} <= trl.extras
    assert any(r.name == "rufus" and {"train", "eval"} <= r.extras for r in gpu)
    theirs = next(Requirement(r) for r in requires("trl") if r.startswith("vllm") and 'extra == "vllm"' in r)
    # TRL's runtime check (it warns outside the range) says the same as its extra
    source = Path(importlib.util.find_spec("trl.import_utils").origin).read_text()
    low, high = re.search(r'Version\("([\d.]+)"\) <= _vllm_base_version <= Version\("([\d.]+)"\)', source).groups()
    assert theirs.specifier.contains(low) and theirs.specifier.contains(high)
    assert not theirs.specifier.contains("0.21.0") and not theirs.specifier.contains("0.31.1")
    assert any(r.startswith("deepspeed") and 'extra == "deepspeed"' in r for r in requires("trl"))
    kernels = next(r for r in gpu if r.name == "kernels")
    cap = next(Requirement(r) for r in requires("transformers") if r.startswith("kernels") and 'extra == "kernels"' in r)
    assert not kernels.specifier.contains("0.19.0") and not cap.specifier.contains("0.19.0")


def test_constraints_pin_what_pyproject_asks_for():
    pinned = pins()
    assert "rufus" not in pinned
    for name in ("torch", "transformers", "trl", "peft", "accelerate", "lm-eval", "datasets", "pytest"):
        assert name in pinned, name
    extras = project()["optional-dependencies"]
    wanted = [*project()["dependencies"], *(r for extra in ("train", "eval", "ray", "dev", "track") for r in extras[extra])]
    for requirement in map(Requirement, wanted):
        name = canonicalize_name(requirement.name)
        assert name in pinned, f"{name} is required but constraints.txt does not pin it"
        assert requirement.specifier.contains(pinned[name], prereleases=True), (str(requirement), pinned[name])


def test_make_installs_with_the_constraints_and_ci_checks_the_gpu_resolve():
    makefile = (REPO / "Makefile").read_text()
    assert re.search(r"^CONSTRAINTS = constraints\.txt$", makefile, re.MULTILINE)
    torch_version = re.search(r"^TORCH_VERSION = (\S+)$", makefile, re.MULTILINE).group(1)
    assert pins()["torch"] == torch_version
    assert re.search(r"^\$\(VENV\)/\.installed: pyproject\.toml \$\(CONSTRAINTS\)$", makefile, re.MULTILINE)  # re-install on change
    editable = [line for line in makefile.splitlines() if "pip install" in line and " -e " in line]
    assert len(editable) == 2 and all("-c $(CONSTRAINTS)" in line for line in editable)  # .venv and the bench extra
    assert re.search(r"^upgrade-deps:", makefile, re.MULTILINE) and "bash scripts/upgrade_deps.sh" in makefile

    upgrade = REPO / "scripts" / "upgrade_deps.sh"  # newest GPU-resolvable versions -> tests -> freeze
    assert subprocess.run(["bash", "-n", str(upgrade)], check=False).returncode == 0
    steps = upgrade.read_text()
    order = [steps.index(s) for s in ('".[train,eval,gpu]"', '-c "$venv/gpu-pins.txt"', "-m pytest -q",
                                      "pip freeze --exclude-editable", "bash scripts/check_resolve.sh")]
    assert order == sorted(order)

    script = REPO / "scripts" / "check_resolve.sh"
    assert subprocess.run(["bash", "-n", str(script)], check=False).returncode == 0
    text = script.read_text()
    assert re.search(r'pip install --dry-run .*--report "\$tmp/report.json" -c constraints.txt', text)
    assert '".[train,eval,gpu]"' in text


def test_the_readmes_package_route_installs_the_tested_versions():
    """The README's route without a checkout (issue 46: it installed the extras unconstrained): the
    wheel's own constraints are written out (`rufus-data env --constraints`, the file the wheel
    ships) before the extras are installed with them, and every install of the clone uses them."""
    readme = (REPO / "README.md").read_text()
    package_route = re.search(r"\*\*As a package\*\*.*?```bash\n(.*?)```", readme, re.DOTALL).group(1)
    lines = [line.split("#")[0].strip() for line in package_route.splitlines()]
    written = lines.index("rufus-data env --constraints > constraints.txt")
    extras = [i for i, line in enumerate(lines) if re.search(r"pip install .*\[train,eval\]", line)]
    assert extras and all(i > written and "-c constraints.txt" in lines[i] for i in extras), package_route
    clone = re.findall(r"pip install [^`\n]*-e \S+", readme)  # typed in a block or named in the text
    assert clone and all("-c constraints.txt" in line for line in clone), clone


@pytest.mark.parametrize(("resolve_rc", "test_rc", "expected_rc"), [(0, 0, 0), (3, 0, 3), (0, 2, 2)])
def test_ci_resolves_the_gpu_install_beside_the_tests_and_fails_on_either(tmp_path, resolve_rc, test_rc, expected_rc):
    """.ci/run with a `make` that records its targets: check-resolve and test both run, the dry
    run's output is printed, and either one failing fails CI."""
    calls = tmp_path / "calls"
    fake = tmp_path / "bin" / "make"
    fake.parent.mkdir()
    fake.write_text(f"""#!/usr/bin/env bash
echo "$1" >> {calls}
if [ "$1" = check-resolve ]; then sleep 0.5; echo "dry run said {resolve_rc}"; exit {resolve_rc}; fi
exit {test_rc}
""")
    fake.chmod(0o755)
    env = {**os.environ, "PATH": f"{fake.parent}:{os.environ['PATH']}", "RUFUS_DATA_ROOT": str(tmp_path)}
    done = subprocess.run(["bash", str(REPO / ".ci" / "run")], env=env, capture_output=True, text=True, check=False)
    assert done.returncode == expected_rc, done.stdout + done.stderr
    if test_rc == 0:  # the dry run is waited for and its output printed once the tests are done
        assert sorted(calls.read_text().split()) == ["check-resolve", "test"]
        assert f"dry run said {resolve_rc}" in done.stdout
    else:  # failed tests end CI at once (the dry run, still running, is stopped)
        assert "test" in calls.read_text().split()
