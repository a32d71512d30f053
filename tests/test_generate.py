"""Generation backends: seeds, hf determinism, the vLLM server client, the context check and
the launcher's process-group cleanup."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import httpx
import pytest

from rufus_data.errors import RufusError
from rufus_data.generate import Prompt, SamplingParams, check_context_fits, prompt_seed, sample_seed
from rufus_data.generate.launcher import LaunchConfig, VLLMServer, group_members, launch

ADD = [Prompt(f"add-{a}-{b}", [{"role": "user", "content": f"What is {a} + {b}? Answer with just the number."}])
       for a, b in [(1, 1), (2, 3), (4, 5)]]


def test_seeds_are_stable_and_per_prompt():
    assert prompt_seed(0, "a") == prompt_seed(0, "a")
    assert len({prompt_seed(0, "a"), prompt_seed(0, "b"), prompt_seed(1, "a")}) == 3
    assert [sample_seed(7, "x", i) for i in range(3)] == [prompt_seed(7, "x") + i for i in range(3)]
    assert SamplingParams(seed=None).prompt_seed("a") is None


def test_bad_sampling_parameters_name_the_field():
    with pytest.raises(RufusError, match=r"top_p=1.5 .*max_tokens=0"):
        SamplingParams(top_p=1.5, max_tokens=0)


# --- hf -------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def hf_generator(builtin_model):
    from rufus_data.generate.hf import HFGenerator

    return HFGenerator(builtin_model, model_name="smollm2-135m")


def test_hf_completions_do_not_depend_on_batch_company(hf_generator):
    sampling = SamplingParams(n=4, max_tokens=12, temperature=1.0, seed=3)
    together = {r.prompt.id: r for r in hf_generator.generate(ADD, sampling)}
    alone = {r.prompt.id: r for r in hf_generator.generate([ADD[2], ADD[0]], sampling)}
    for pid in (ADD[0].id, ADD[2].id):
        assert [c.token_ids for c in together[pid].completions] == [c.token_ids for c in alone[pid].completions]
    result = together[ADD[1].id]
    assert len({c.text for c in result.completions}) > 1, "the n samples of one prompt must differ"
    for completion in result.completions:
        assert completion.finish_reason in ("stop", "length")
        assert len(completion.logprobs) == len(completion.token_ids) <= 12
        assert all(lp <= 0 for lp in completion.logprobs)
    other_seed = hf_generator.generate([ADD[0]], SamplingParams(n=4, max_tokens=12, seed=4))[0]
    assert [c.text for c in other_seed.completions] != [c.text for c in together[ADD[0].id].completions]


# --- the server client against a real vLLM CPU server ------------------------------------------
@pytest.mark.vllm
def test_server_samples_differ_spread_over_urls_and_reproduce(vllm_server):
    from rufus_data.generate.server import ServerConfig, ServerGenerator

    port = vllm_server.base_url.rsplit(":", 1)[1]
    urls = [vllm_server.base_url, f"http://localhost:{port}/v1"]  # two names of one server
    gen = ServerGenerator(ServerConfig(base_urls=urls, model=vllm_server.model, concurrency=4))
    sampling = SamplingParams(n=4, max_tokens=16, temperature=1.0, seed=11)
    results = gen.generate(ADD, sampling)
    assert all(count >= 1 for count in gen.sent.values()), gen.sent
    for result in results:
        texts = [c.text for c in result.completions]
        assert len(set(texts)) > 1, texts
        seeds = [c.seed for c in result.completions]
        assert seeds == [sample_seed(11, result.prompt.id, i) for i in range(4)]
        for c in result.completions:
            assert c.token_ids and len(c.logprobs) == len(c.token_ids)
    again = gen.generate([ADD[0]], sampling)[0]
    alone = gen.generate([ADD[0]], sampling)[0]
    assert [c.token_ids for c in again.completions] == [c.token_ids for c in alone.completions]


@pytest.mark.vllm
def test_context_check_refuses_with_both_numbers_and_the_fix(vllm_server):
    assert check_context_fits(vllm_server.base_url, 100, 64) == "ok"
    with pytest.raises(RufusError) as err:
        check_context_fits(vllm_server.base_url, 2000, 100)
    message = str(err.value)
    for part in ("2000 tokens", "max_tokens (100)", "max_model_len=2048", "--max-model-len", "--max-tokens"):
        assert part in message, message


def test_context_check_is_skipped_when_no_server_answers():
    from rufus_data.generate.launcher import free_port

    started = time.monotonic()
    assert check_context_fits(f"http://127.0.0.1:{free_port()}", 10, 10, retries=2, delay_s=0.1) == "skipped"
    assert time.monotonic() - started < 10


# --- the launcher's cleanup, with a small real stand-in server -----------------------------------
STAND_IN = textwrap.dedent(
    """
    import http.server, json, os, subprocess, sys, time
    port = int(sys.argv[sys.argv.index("--port") + 1])
    mode = os.environ.get("STAND_IN_MODE", "serve")
    open(os.environ["STAND_IN_ENV_FILE"], "w").write(json.dumps({"cvd": os.environ.get("CUDA_VISIBLE_DEVICES")}))
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])  # an 'engine worker'
    if mode == "crash":
        sys.exit(3)
    if mode == "hang":
        time.sleep(600)
    class Models(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = json.dumps({"data": [{"id": "stand-in", "max_model_len": 64}]}).encode()
            self.send_response(200); self.end_headers(); self.wfile.write(body)
        def log_message(self, *args):
            pass
    http.server.HTTPServer(("127.0.0.1", port), Models).serve_forever()
    """
)


@pytest.fixture
def stand_in(tmp_path, monkeypatch):
    script = tmp_path / "stand_in.py"
    script.write_text(STAND_IN)
    env_file = tmp_path / "env.json"
    monkeypatch.setenv("STAND_IN_ENV_FILE", str(env_file))

    def config(mode="serve", timeout=30.0, devices=None):
        monkeypatch.setenv("STAND_IN_MODE", mode)
        return LaunchConfig(model="stand-in", command=[sys.executable, str(script)], cpu=False, devices=devices,
                            ready_timeout_s=timeout, log_path=str(tmp_path / "server.log"))

    config.env_file = env_file
    return config


def _gone(pgid: int, within_s: float = 10.0) -> bool:
    deadline = time.monotonic() + within_s
    while group_members(pgid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def test_launcher_stops_the_whole_group_when_the_block_fails(stand_in):
    before = os.environ.get("CUDA_VISIBLE_DEVICES")
    with pytest.raises(ValueError), launch(stand_in(devices="3")) as server:
        pgid = server.pgid
        assert len(group_members(pgid)) >= 2  # the server and its worker
        assert httpx.get(f"{server.base_url}/v1/models").json()["data"][0]["max_model_len"] == 64
        assert check_context_fits(server.base_url, 56, 8) == "ok"
        with pytest.raises(RufusError, match="max_model_len=64"):
            check_context_fits(server.base_url, 60, 8)
        raise ValueError("a failing test body")
    assert _gone(pgid), f"leaked processes {group_members(pgid)}"
    assert json.loads(stand_in.env_file.read_text())["cvd"] == "3"  # the server saw the devices
    assert os.environ.get("CUDA_VISIBLE_DEVICES") == before  # this process did not


def test_launcher_gives_up_on_a_server_that_never_gets_ready(stand_in):
    server = VLLMServer(stand_in(mode="hang", timeout=2.0))
    with pytest.raises(RufusError, match="not ready after 2 s"):
        server.start()
    assert server.process is None


def test_launcher_reports_a_server_that_dies(stand_in):
    with pytest.raises(RufusError, match="exited with code 3 before it was ready"):
        launch(stand_in(mode="crash"))


def test_server_dies_with_a_sigkilled_parent(stand_in, tmp_path):
    """A run killed with SIGKILL runs no atexit hook: PR_SET_PDEATHSIG still stops its server."""
    cfg = stand_in()
    code = textwrap.dedent(
        f"""
        import sys, time
        from rufus_data.generate.launcher import LaunchConfig, launch
        server = launch(LaunchConfig(model="stand-in", command={cfg.command!r}, cpu=False, ready_timeout_s=30))
        print(server.pgid, flush=True)
        time.sleep(600)
        """
    )
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    pgid = int(parent.stdout.readline())
    try:
        assert group_members(pgid)
        parent.send_signal(signal.SIGKILL)
        parent.wait()
        # the kernel SIGTERMs the server (the group leader); a real vLLM server then stops its
        # engine processes, the stand-in's 'worker' is cleaned up below
        assert _gone_leader(pgid)
    finally:
        if group_members(pgid):
            os.killpg(pgid, signal.SIGKILL)


def _gone_leader(pid: int, within_s: float = 10.0) -> bool:
    deadline = time.monotonic() + within_s
    while pid in group_members(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True
