"""The README's data commands run in the order it gives them, after `make demo`: a command that
writes an output folder an earlier one wrote says --overwrite (or writes elsewhere), or the reader's
second command fails on the first one's folder."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

from rufus_data.mix.config import default_out

REPO = Path(__file__).resolve().parents[1]
WRITERS = ("mix", "decontam", "dedup", "filter", "pairs")
NOTHING_WRITTEN = ("--dry-run", "--report-only")
SYNOPSIS = re.compile(r"\b(DIR|MODEL|N|FILE)\b")  # a usage line with placeholders, not a command to type


def commands(text: str) -> list[list[str]]:
    """Every `rufus-data STEP ...` line of the bash blocks, in order, as its words (comments and
    bracketed optional bounds left out), synopsis lines skipped."""
    found = []
    for block in re.findall(r"```bash\n(.*?)```", text, re.DOTALL):
        for line in block.splitlines():
            typed = re.sub(r"\[[^]]*\]", " ", line.split("#")[0]).strip()
            words = shlex.split(typed) if typed.startswith("rufus-data ") else []
            if len(words) > 1 and words[1] in WRITERS and not SYNOPSIS.search(line.split("#")[0]):
                found.append(words)
    return found


def output_of(words: list[str]) -> Path | None:
    """The folder a command writes: --out, else the step's default (None: it writes nothing)."""
    if any(flag in words for flag in NOTHING_WRITTEN):
        return None
    if "--out" in words:
        return Path(words[words.index("--out") + 1])
    step, given = words[1], words[2:3] if len(words) > 2 and not words[2].startswith("-") else []
    if step == "mix":
        return default_out(Path(given[0]).stem)
    if step in ("filter", "pairs"):  # outputs/<input name>-<step>, the default input catalogs/rl.yaml
        name = Path(given[0]).stem if given else "rl"
        return Path("outputs") / f"{name}-{'filtered' if step == 'filter' else 'pairs'}"
    raise AssertionError(f"{' '.join(words)}: a {step} without --out")


def test_the_readmes_commands_run_in_order_after_make_demo():
    demo = re.search(r"^demo:.*\n((?:\t.*\n)+)", (REPO / "Makefile").read_text(), re.MULTILINE).group(1)
    written = {output_of(shlex.split(line.replace("$(BIN)/", ""))) for line in demo.splitlines()
               if "rufus-data mix" in line}
    assert written == {Path("outputs/sft")}
    listed = commands((REPO / "README.md").read_text())
    assert len(listed) >= 10
    for words in listed:
        out = output_of(words)
        if out is None:
            continue
        assert out not in written or "--overwrite" in words, f"`{' '.join(words)}` finds {out} from an earlier command"
        written.add(out)


def test_the_readmes_dedup_example_on_the_demo_mix_drops_nothing_and_warns_nothing(tmp_path, monkeypatch):
    """The sample sources are distinct rows (scripts/make_samples.py): dedup on `make demo`'s mix
    finds no near duplicate, so it cannot tilt the mix ("Dedup belongs before mixing")."""
    from typer.testing import CliRunner

    from rufus_data.cli import app

    monkeypatch.chdir(tmp_path)
    runner = CliRunner()
    demo = runner.invoke(app, ["mix", "catalogs/sft.yaml"])
    assert demo.exit_code == 0, demo.output
    dedup = next(words for words in commands((REPO / "README.md").read_text())
                 if words[1] == "dedup" and output_of(words))
    result = runner.invoke(app, dedup[1:], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "Dedup belongs before mixing" not in result.output and "warning" not in result.output.lower()
    assert re.search(r"│\s+(\d+) │\s+\1 │\s+0 │\s+0 │", result.stdout), result.stdout  # rows in = out, 0 dropped
    # and the 0 is said with what was measured, so that it does not read as a success
    said = " ".join(result.output.split())
    assert re.search(r"note: no row was removed: of [\d,]+ rows .*LSH put [\d,]+ beside a similar row, and 0 pairs "
                     r"met containment >= 0.8", said), said
