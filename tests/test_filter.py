"""`rufus-data filter` on real prompts with the built-in model: hf backend, a real vLLM CPU
server, re-bucketing from rollouts, and resumption after SIGKILL (on tiny-random: the journal's
bookkeeping does not depend on the answers)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from rl_prompts import NUMBER_REWARD, arithmetic_rows, gsm8k_rows, write_rl_shards
from typer.testing import CliRunner

from rufus_data.base.errors import RufusError
from rufus_data.cli import app
from rufus_data.folders.shards import read_manifest, read_shards
from rufus_data.rollouts.filter import BUCKETS, FilterConfig, filter_prompts, parse_band, partial_dir

RUFUS_DATA = str(Path(sys.executable).parent / "rufus-data")
HF_SETTINGS = {"k": 4, "max_tokens": 16, "temperature": 0.7, "seed": 0}


def cli_args(shards: Path, out: Path, backend: str = "hf", extra: tuple = (), policy: str = "smollm2-135m") -> list[str]:
    return [
        "filter", str(shards), "--out", str(out), "--policy", policy, "--reward", json.dumps(NUMBER_REWARD),
        "--k", "4", "--max-tokens", "16", "--temperature", "0.7", "--seed", "0", "--backend", backend, *extra,
    ]


@pytest.fixture(scope="module")
def hf_shards(tmp_path_factory, data_root) -> Path:
    folder = tmp_path_factory.mktemp("filter-in") / "rl"
    return write_rl_shards(folder, arithmetic_rows(8) + gsm8k_rows(data_root, 2))


def hf_filter(shards: Path, policy: str, out: Path) -> Path:
    filter_prompts([shards], out, FilterConfig(policy=policy, reward=[NUMBER_REWARD], backend="hf", **HF_SETTINGS))
    return out


@pytest.fixture(scope="module")
def hf_run(hf_shards, builtin_model, tmp_path_factory) -> Path:
    return hf_filter(hf_shards, "smollm2-135m", tmp_path_factory.mktemp("filter-hf") / "out")


@pytest.fixture(scope="module")
def tiny_run(hf_shards, tiny_model, tmp_path_factory) -> Path:
    """hf_run's filter on tiny-random: what a resumed run of it must end with."""
    return hf_filter(hf_shards, "tiny-random", tmp_path_factory.mktemp("filter-tiny") / "out")


def bucket_ids(out: Path) -> dict[str, list[str]]:
    return {b: read_shards(out / b).column("id").to_pylist() for b in BUCKETS}


def assert_buckets_match_rewards(out: Path, k: int) -> dict:
    """Every prompt's bucket and pass_rate follow from the rewards stored in rollouts.parquet."""
    rollouts = pq.read_table(out / "rollouts.parquet").to_pylist()
    per_prompt: dict[str, list] = {}
    for row in rollouts:
        per_prompt.setdefault(row["prompt_id"], []).append(row["reward"])
    assert all(len(r) == k for r in per_prompt.values())
    seen = {}
    for bucket in BUCKETS:
        table = read_shards(out / bucket)
        assert {"id", "prompt", "expected_output", "pass_rate", "source", "label"} <= set(table.column_names)
        for row in table.to_pylist():
            rewards = [r for r in per_prompt[row["id"]] if r is not None]
            assert row["id"] not in seen
            seen[row["id"]] = bucket
            if not rewards:
                assert bucket == "unscored" and row["pass_rate"] is None
                continue
            p = sum(rewards) / len(rewards)
            assert row["pass_rate"] == pytest.approx(p)
            expected = "all_pass" if p == 1 else "all_fail" if p == 0 else "learnable"
            assert bucket == expected, (row["id"], rewards, bucket)
    assert set(seen) == set(per_prompt)
    return seen


def test_hf_filter_fills_learnable_and_all_fail(hf_run):
    seen = assert_buckets_match_rewards(hf_run, k=4)
    ids = bucket_ids(hf_run)
    assert ids["learnable"], "the 135M model solves single-digit additions some of the time"
    assert ids["all_fail"] and {"gsm8k-test-0", "gsm8k-test-1"} <= set(ids["all_fail"]) | set(ids["learnable"])
    assert len(seen) == 10
    rollouts = pq.read_table(hf_run / "rollouts.parquet")
    first = rollouts.slice(0, 1).to_pylist()[0]
    assert first["model"] == "smollm2-135m" and first["backend"] == "hf"
    assert json.loads(first["sampling"]) == {**json.loads(first["sampling"]), "n": 4, "max_tokens": 16, "seed": 0}
    assert first["num_tokens"] == len(first["token_ids"]) <= 16
    report = (hf_run / "report.md").read_text()
    assert "| arithmetic |" in report and "| math |" in report and "learnable" in report
    assert (hf_run / "pass_rate_hist.png").stat().st_size > 1000
    manifest = read_manifest(hf_run)
    assert manifest["counts"]["learnable"] == len(ids["learnable"]) and manifest["generation"]["prompts_generated"] == 10
    assert not partial_dir(hf_run).exists()


def test_rebucket_from_rollouts_applies_a_band_without_generating(hf_run, tmp_path):
    out = tmp_path / "band"
    result = CliRunner().invoke(app, ["filter", "--from-rollouts", str(hf_run), "--keep", "0.3<p<0.7", "--out", str(out)])
    assert result.exit_code == 0, result.output
    before, after = bucket_ids(hf_run), bucket_ids(out)
    assert after["all_fail"] == before["all_fail"] and after["all_pass"] == before["all_pass"]
    band = parse_band("0.3<p<0.7")
    for row in read_shards(out / "learnable").to_pylist():
        assert band(row["pass_rate"])
    outside = read_shards(out / "outside_band").column("id").to_pylist() if (out / "outside_band").exists() else []
    assert sorted(after["learnable"] + outside) == sorted(before["learnable"])
    assert read_manifest(out)["command"] == "rufus-data filter --from-rollouts"


def test_bad_band_and_bad_input_are_clear_errors(tmp_path, hf_shards):
    with pytest.raises(RufusError, match="not a pass-rate band"):
        parse_band("between 0.1 and 0.9")
    for band, problem in (("1.2.3<p", "'1.2.3' is not a number"), ("0.9<p<0.1", "is empty: its low bound 0.9"),
                          ("0.5<=p<=0.5", "is empty"), ("p<1.5", "1.5 is outside [0, 1]"), ("p>=2", "2.0 is outside")):
        with pytest.raises(RufusError) as err:
            parse_band(band)
        assert f"--keep {band!r}" in str(err.value) and problem in str(err.value) and '"0.1<p<0.9"' in str(err.value)
    assert parse_band("0<p<1")(0.5) and not parse_band("0.2<=p")(0.1) and parse_band("p<=1")(1.0)
    refused = CliRunner().invoke(app, cli_args(hf_shards, tmp_path / "band", extra=("--keep", "0.9<p<0.1")))
    assert refused.exit_code == 2 and "0.9<p<0.1" in refused.output and not (tmp_path / "band").exists()
    bad = write_rl_shards(tmp_path / "dup", arithmetic_rows(2) + arithmetic_rows(1))
    config = FilterConfig(policy="smollm2-135m", reward=[NUMBER_REWARD], **HF_SETTINGS)
    with pytest.raises(RufusError, match=r"row 2 \(id 'add-1-1'\): duplicate id"):
        filter_prompts([bad], tmp_path / "out", config)
    assert not (tmp_path / "out").exists()


def test_rollout_hash_follows_input_content_not_its_path(hf_shards, tmp_path):
    """A re-run from another directory (or on a copy of the shards) resumes the same journal."""
    from rufus_data.rollouts.prompts import read_prompt_rows

    copy = tmp_path / "copied" / "rl"
    shutil.copytree(hf_shards, copy)
    config = FilterConfig(policy="smollm2-135m", reward=[NUMBER_REWARD], backend="hf", **HF_SETTINGS)
    fewer = write_rl_shards(tmp_path / "fewer", arithmetic_rows(7))
    hashes = [config.rollout_hash(read_prompt_rows([folder])[2]) for folder in (hf_shards, copy, fewer)]
    assert hashes[0] == hashes[1] != hashes[2]


def _journal_lines(out: Path) -> list[dict]:
    lines = []
    for path in partial_dir(out).glob("*.jsonl"):
        for line in path.read_text().splitlines(keepends=True):
            if line.endswith("\n"):
                lines.append(json.loads(line))
    return lines


def _kill_midway(args: list[str], out: Path, at_least: int, timeout_s: float = 300) -> list[dict]:
    """Start the CLI, SIGKILL it once `at_least` prompts are journaled; return the journal then."""
    proc = subprocess.Popen([RUFUS_DATA, *args], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + timeout_s
    try:
        while len(_journal_lines(out)) < at_least:
            assert proc.poll() is None, f"the run ended before it could be killed: {proc.stderr.read()[-2000:]}"
            assert time.monotonic() < deadline, "no journal progress"
            time.sleep(0.05)
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait()
    assert not out.exists(), "a killed run must not leave an output folder"
    return _journal_lines(out)


def _kill_and_resume(args: list[str], out: Path, k: int) -> list[dict]:
    """SIGKILL the CLI once 3 prompts are journaled, run it again to the end and check that no
    prompt was lost or generated twice; returns the journal as the kill left it."""
    before_kill = _kill_midway(args, out, at_least=3)
    done = subprocess.run([RUFUS_DATA, *args], check=False, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    _assert_resumed(out, before_kill, k)
    return before_kill


def _assert_resumed(out: Path, before_kill: list[dict], k: int) -> None:
    rollouts = pq.read_table(out / "rollouts.parquet").to_pylist()
    per_prompt: dict[str, list] = {}
    for row in rollouts:
        per_prompt.setdefault(row["prompt_id"], []).append(row)
    assert all(len(rows) == k for rows in per_prompt.values()), "no prompt lost or generated twice"
    for record in before_kill:  # finished before the kill: kept, not generated again
        rows = per_prompt[record["prompt_id"]]
        assert [r["completion"] for r in rows] == [c["text"] for c in record["completions"]]
        assert {r["generated_by_pid"] for r in rows} == {record["pid"]}
    assert len({rows[0]["generated_by_pid"] for rows in per_prompt.values()}) == 2  # two runs shared the work
    assert not partial_dir(out).exists()


@pytest.mark.spawn
def test_hf_resume_after_sigkill_ends_with_the_uninterrupted_buckets(hf_shards, tiny_run, tmp_path):
    out = tmp_path / "resumed"
    before_kill = _kill_and_resume(cli_args(hf_shards, out, policy="tiny-random"), out, k=4)
    assert 3 <= len(before_kill) < 10
    assert bucket_ids(out) == bucket_ids(tiny_run)
    ours = pq.read_table(out / "rollouts.parquet").select(["prompt_id", "completion", "reward"])
    assert ours.equals(pq.read_table(tiny_run / "rollouts.parquet").select(["prompt_id", "completion", "reward"]))


# --- through a real vLLM CPU server ------------------------------------------------------------
@pytest.fixture(scope="module")
def vllm_shards(tmp_path_factory, data_root) -> Path:
    folder = tmp_path_factory.mktemp("filter-vllm") / "rl"
    return write_rl_shards(folder, arithmetic_rows(12) + gsm8k_rows(data_root, 4))


@pytest.mark.vllm
def test_vllm_filter_buckets_and_refuses_prompts_that_do_not_fit(vllm_server, vllm_shards, tmp_path):
    out = tmp_path / "out"
    config = FilterConfig(policy="smollm2-135m", reward=[NUMBER_REWARD], backend="server",
                          base_urls=[vllm_server.base_url], concurrency=8, **{**HF_SETTINGS, "max_tokens": 24})
    summary = filter_prompts([vllm_shards], out, config)
    assert_buckets_match_rewards(out, k=4)
    assert summary.counts["learnable"] > 0 and summary.counts["all_fail"] > 0, summary
    assert read_manifest(out)["max_model_len_check"] == "ok"
    assert pq.read_table(out / "rollouts.parquet").column("backend")[0].as_py() == "server"

    refused = CliRunner().invoke(
        app, cli_args(vllm_shards, tmp_path / "refused", "server", ("--base-url", vllm_server.base_url, "--max-tokens", "2040"))
    )
    assert refused.exit_code == 2
    text = " ".join(refused.output.split())
    assert "plus max_tokens (2040)" in text and "max_model_len (2048)" in text and "--max-model-len" in text, text
    assert not (tmp_path / "refused").exists()


@pytest.mark.vllm
@pytest.mark.slow  # 190 s in CI; the resume protocol is backend-independent and CI proves it on hf
def test_vllm_resume_after_sigkill_loses_and_repeats_no_prompt(vllm_server, data_root, tmp_path):
    shards = write_rl_shards(tmp_path / "rl", arithmetic_rows(4) + gsm8k_rows(data_root, 12))
    out = tmp_path / "out"
    args = cli_args(shards, out, "server", ("--base-url", vllm_server.base_url, "--concurrency", "1"))
    assert len(_kill_and_resume(args, out, k=4)) < 16
    assert len(pq.read_table(out / "rollouts.parquet")) == 16 * 4
    shutil.rmtree(out)


@pytest.mark.vllm
def test_vllm_backend_starts_and_stops_its_own_server(tmp_path, monkeypatch):
    """`--backend vllm`: Rufus launches vLLM's CPU build itself, filters through it, and leaves no
    process of its group behind."""
    from rufus_data.generate.launcher import VLLMServer, group_members
    from rufus_data.generate.vllm_command import CPU_VENV, cpu_command

    if not (CPU_VENV / ".installed").exists():
        reason = f"vLLM CPU build not installed ({CPU_VENV}/.installed missing): run `make vllm-venv`"
        print(f"\nSKIP: {reason}")
        pytest.skip(reason)

    started: list[int] = []
    original_start = VLLMServer.start

    def recording_start(self):
        server = original_start(self)
        started.append(server.pgid)
        return server

    monkeypatch.setattr(VLLMServer, "start", recording_start)
    shards = write_rl_shards(tmp_path / "rl", arithmetic_rows(4))
    config = FilterConfig(policy="smollm2-135m", reward=[NUMBER_REWARD], backend="vllm", vllm_command=cpu_command(),
                          max_model_len=512, k=2, max_tokens=4, temperature=0.7, seed=0, concurrency=4)
    try:
        summary = filter_prompts([shards], tmp_path / "out", config)
        assert len(started) == 1
        assert summary.manifest["completions"] == 8 and read_manifest(tmp_path / "out")["max_model_len_check"] == "ok"
        assert_buckets_match_rewards(tmp_path / "out", k=2)
        assert group_members(started[0]) == [], f"vLLM processes left behind: {group_members(started[0])}"
    finally:
        for pgid in started:
            if group_members(pgid):
                os.killpg(pgid, signal.SIGKILL)
