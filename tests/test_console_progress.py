"""Progress without a terminal (CI logs, `nohup`): rich draws its bars only when a job ends there,
so every long command prints plain progress lines to stderr, every $RUFUS_PROGRESS_SECONDS."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest
from test_filter import RUFUS_DATA

from rufus_data.base.console import ProgressLines, progress_line
from rufus_data.base.quiet_bars import BAR_SWITCHES, bars_off, quiet_bars_off_a_terminal

REPO = Path(__file__).resolve().parents[1]


def run_mix(tmp_path, seconds: str, out: str) -> subprocess.CompletedProcess:
    """`rufus-data mix catalogs/rl.yaml`, its stderr a pipe."""
    env = {**os.environ, "RUFUS_PROGRESS_SECONDS": seconds}
    return subprocess.run([RUFUS_DATA, "mix", str(REPO / "catalogs" / "rl.yaml"), "--out", out], check=False,
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)


@pytest.mark.spawn
def test_a_long_job_without_a_terminal_prints_progress_lines(tmp_path):
    every = run_mix(tmp_path, "0", "every")
    assert every.returncode == 0, every.stderr[-2000:]
    lines = re.findall(r"^progress (arithmetic|word_problems): (\d+)/(\d+) rows \((\d+)%\), .*, elapsed \d:\d\d:\d\d, "
                       r"ETA \S+$", every.stderr, re.MULTILINE)
    assert {name for name, *_ in lines} == {"arithmetic", "word_problems"}
    assert ("arithmetic", "0", "300", "0") in lines and ("arithmetic", "300", "300", "100") in lines  # start and end

    hourly = run_mix(tmp_path, "3600", "hourly")
    assert hourly.returncode == 0
    assert len(re.findall(r"^progress ", hourly.stderr, re.MULTILINE)) == 4  # per task: as it starts, as it ends
    assert "━" not in hourly.stderr  # and no bar drawn at the end beside them

    bad = run_mix(tmp_path, "soon", "bad")
    assert bad.returncode == 2 and "RUFUS_PROGRESS_SECONDS='soon' is not a number of seconds" in bad.stderr


def test_a_progress_line_says_count_share_rates_and_time():
    from rich.console import Console

    from rufus_data.base.console import RateColumn

    bar = ProgressLines(console=Console(file=open(os.devnull, "w")), unit="prompts", interval=60)  # noqa: SIM115
    task = bar.add_task("filter k=8", total=384)
    bar.update(task, completed=120)
    line = progress_line(bar.tasks[0], "prompts", [RateColumn("prompts")])
    assert re.fullmatch(r"progress filter k=8: 120/384 prompts \(31%\), \S+( prompts/s)?, elapsed 0:00:00, ETA \S+", line), line


def test_without_a_terminal_each_task_shows_where_it_started_and_ended_and_no_bar():
    """rich drew the finished bar at the end beside the progress lines: every progress twice."""
    import io

    from rich.console import Console

    out = io.StringIO()
    with ProgressLines(console=Console(file=out, force_terminal=False), unit="rows", interval=3600) as bar:
        job = bar.add_task("mix", total=3)
        for _ in range(3):
            bar.advance(job)
    lines = out.getvalue().splitlines()
    assert [line.split(",")[0] for line in lines] == ["progress mix: 0/3 rows (0%)", "progress mix: 3/3 rows (100%)"]
    assert "━" not in out.getvalue()


def test_a_table_on_stderr_keeps_whole_cells_in_a_file():
    """A summary table squeezed to the 80 columns rich assumes for a file read as nonsense."""
    import io

    from rich.console import Console
    from rich.table import Table

    from rufus_data.base.console import print_whole

    table = Table(title="checkpoint evaluation")
    for name in ("step", *(f"task_with_a_long_name_{i}" for i in range(6))):
        table.add_column(name)
    table.add_row("100", *("0.1234 ± 0.0123" for _ in range(6)))
    out = io.StringIO()
    print_whole(Console(file=out, width=80, force_terminal=False), table)
    text = out.getvalue()
    assert all(f"task_with_a_long_name_{i}" in text for i in range(6)) and text.count("0.1234 ± 0.0123") == 6


TQDM_BAR = re.compile(r"\d+%\|.*\|")  # tqdm's `45%|████▌     | 9/20`


@pytest.mark.spawn
def test_third_party_bars_stay_off_a_pipe(tmp_path):
    """lm-eval's, datasets' and transformers' tqdm bars, piped, were a redraw per line beside Rufus's
    progress lines; off a terminal they are off (rufus_data/base/quiet_bars.py)."""
    env = {key: value for key, value in os.environ.items() if key not in BAR_SWITCHES}
    run = subprocess.run([str(Path(RUFUS_DATA).with_name("rufus-eval")), "suite", "quick", "--ckpt", "tiny-random",
                          "--tasks", "gsm8k", "--limit", "1", "--repeats", "1", "--max-tokens", "8", "--out",
                          str(tmp_path / "run")], check=False, cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    assert not TQDM_BAR.search(run.stderr + run.stdout), (run.stderr + run.stdout)[-3000:]
    assert "run folder:" in run.stderr  # Rufus's own lines still come


def test_bars_are_turned_off_only_off_a_terminal_and_never_against_the_user(monkeypatch):
    import io

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    import tqdm.std

    monkeypatch.setattr(tqdm.std.tqdm, "__init__", tqdm.std.tqdm.__dict__["__init__"])  # put back after
    for name in BAR_SWITCHES:
        monkeypatch.delenv(name, raising=False)
    assert not quiet_bars_off_a_terminal(Terminal()) and "TQDM_DISABLE" not in os.environ
    assert quiet_bars_off_a_terminal(io.StringIO()) and bars_off()
    assert all(os.environ[name] == "1" for name in BAR_SWITCHES)
    # a tqdm imported before the switch (by an import the CLI made first) draws no bar either
    from tqdm.auto import tqdm as auto_tqdm

    assert tqdm.std.tqdm(range(3)).disable and auto_tqdm(range(3)).disable
    assert not tqdm.std.tqdm(range(3), disable=False).disable  # the caller's own choice stands
    monkeypatch.setenv("TQDM_DISABLE", "0")
    assert not quiet_bars_off_a_terminal(io.StringIO())  # the user's choice stands
