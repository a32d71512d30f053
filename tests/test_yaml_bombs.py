"""Hostile YAML and huge values: aliases that would expand past any config's size are refused
when the file is read (issue #47, item 10), and a message quotes a user's value bounded."""

from __future__ import annotations

import time
import tracemalloc

import pytest
from typer.testing import CliRunner

from rufus_data.base.errors import RufusError, quoted
from rufus_data.base.yaml_config import MAX_YAML_NODES, load_yaml_text
from rufus_data.cli import app
from rufus_data.rewards.registry import parse_spec


def laughs(levels: int = 9, width: int = 10) -> str:
    """A billion-laughs ladder: each anchor a list of `width` aliases of the one before."""
    lines = [f"l0: &l0 [{', '.join(['lol'] * width)}]"]
    lines += [f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * width)}]" for i in range(1, levels)]
    return "\n".join(lines)


def test_an_alias_bomb_under_a_sources_reward_is_refused_at_once(tmp_path):
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"prompt": "1+1?", "solution": "2"}\n')
    bomb = "\n".join("    " + line for line in laughs().splitlines())
    catalog = tmp_path / "bomb.yaml"
    catalog.write_text(f"kind: rl\nname: bomb\nsources:\n  - name: src\n    path: {rows}\n    share: 1.0\n"
                       f"    reward:\n      name: string_match\n      extra:\n{bomb}\n")
    tracemalloc.start()
    started = time.process_time()  # CPU time: the expansion's cost, whatever else the machine runs
    result = CliRunner().invoke(app, ["mix", str(catalog), "--out", str(tmp_path / "out")])
    seconds, (_, peak) = time.process_time() - started, tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert result.exit_code == 2, result.output
    text = " ".join(result.output.split())
    assert str(catalog) in text and "YAML aliases expand to 1,234,567," in text
    assert seconds < 10 and peak < 50e6  # the probe: 118 s and 5.6 GB, then an abort
    assert not (tmp_path / "out").exists()


def test_every_reader_refuses_recursive_and_exploding_aliases_and_reads_normal_ones():
    with pytest.raises(RufusError, match=f"more than the {MAX_YAML_NODES:,}"):
        load_yaml_text(laughs(), "--reward")
    with pytest.raises(RufusError, match="line 1: an alias refers to the value that holds it"):
        load_yaml_text("a: &a [1, *a]\n", "x.yaml")
    assert load_yaml_text("base: &b {lr: 1}\nstage: *b\n", "ok.yaml") == {"base": {"lr": 1}, "stage": {"lr": 1}}
    assert load_yaml_text(laughs(levels=4), "small.yaml")["l3"][0][0][0] == ["lol"] * 10  # 1,111 values: fine


def test_a_huge_value_is_quoted_short_and_fast():
    value = "x"
    for _ in range(40):  # 2**40 leaves if expanded
        value = [value, value]
    started = time.process_time()  # CPU time, not the wall clock a busy machine stretches
    text = quoted({"name": "nope", "spec": value})
    assert len(text) <= 200 and time.process_time() - started < 1
    with pytest.raises(RufusError) as err:
        parse_spec({"name": "no_such_reward", "blob": "y" * 100_000, "deep": value})
    assert len(str(err.value)) < 600 and "no_such_reward" in str(err.value)
