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
from pathlib import Path

import httpx
import pytest
from openai_stub import OpenAIStub, Reply, Request, Traffic

from rufus_data.base.errors import RufusError
from rufus_data.base.ports import free_port
from rufus_data.generate import Prompt, SamplingParams, prompt_seed, sample_seed
from rufus_data.generate.backends import check_prompts_fit, longest_prompt_tokens
from rufus_data.generate.context import check_context_fits
from rufus_data.generate.launcher import LaunchConfig, VLLMServer, group_members, launch
from rufus_data.generate.server import ServerConfig, ServerGenerator
from rufus_data.generate.vllm_command import VLLMServerArgs, format_command, server_command
from rufus_data.models.reference import ModelRef

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
def hf_generator(tiny_model):
    from rufus_data.generate.hf import HFGenerator

    return HFGenerator(ModelRef.of(tiny_model), model_name="tiny-random")


def test_hf_completions_do_not_depend_on_batch_company(hf_generator):
    sampling = SamplingParams(n=4, max_tokens=12, temperature=1.0, seed=3)
    together = {r.prompt.id: r for r in hf_generator.generate(ADD, sampling)}
    alone = {r.prompt.id: r for r in hf_generator.generate([ADD[2], ADD[0]], sampling)}
    for pid in (ADD[0].id, ADD[2].id):
        assert [c.token_ids for c in together[pid].completions] == [c.token_ids for c in alone[pid].completions]
    result = together[ADD[1].id]
    assert len({c.text for c in result.completions}) > 1, "the n samples of one prompt must differ"
    # the recorded seed is the one that reproduces the samples: the prompt seed of the n-row batch
    assert {c.seed for c in result.completions} == {prompt_seed(3, ADD[1].id)}
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
    for part in ("2000 tokens", "max_tokens (100)", "max_model_len (2048)", "--max-model-len", "--max-tokens"):
        assert part in message, message


def test_context_check_is_skipped_when_no_server_answers(monkeypatch):
    """Two attempts, 0.1 s apart (about), then "skipped": counted, not timed, so a busy machine
    cannot fail it."""
    from rufus_data.models.openai_api import RetryPolicy
    attempts, waits = [], []
    real_call = RetryPolicy.call

    def counted(policy, attempt, *, what, sleep=None):
        return real_call(policy, lambda left: attempts.append(left) or attempt(left), what=what,
                         sleep=lambda s: waits.append(s) or time.sleep(s))

    monkeypatch.setattr(RetryPolicy, "call", counted)
    assert check_context_fits(f"http://127.0.0.1:{free_port()}", 10, 10, retries=2, delay_s=0.1) == "skipped"
    assert len(attempts) == 2 and len(waits) == 1 and waits[0] <= 0.1 * 1.2


def test_skipped_context_check_says_why(tiny_model, capsys):
    dead = f"http://127.0.0.1:{free_port()}"
    sampling = SamplingParams(max_tokens=8)
    no_tokenizer = ServerGenerator(ServerConfig(base_urls=[dead], model="served-name"))
    status = check_prompts_fit(no_tokenizer, "/nonexistent/served-model", ADD, sampling)
    assert status == "skipped: no local tokenizer for '/nonexistent/served-model' to count the prompt tokens"
    printed = " ".join(capsys.readouterr().err.split())
    assert f"max_model_len check {status}" in printed and "GET /v1/models" not in printed

    no_answer = ServerGenerator(ServerConfig(base_urls=[dead], model="smollm2-135m"))
    status = check_prompts_fit(no_answer, tiny_model, ADD, sampling)
    assert status == f"skipped: the server did not answer GET /v1/models at {dead}"
    assert f"max_model_len check {status}" in " ".join(capsys.readouterr().err.split())


def test_a_served_hub_name_without_a_local_copy_is_not_asked_of_the_hub(monkeypatch):
    """`--backend server --policy ORG/NAME` offline, with HF_HUB_OFFLINE set after the hub client
    was imported (a notebook, a test session): the prompt count is skipped at once; it waited
    through the hub client's retries (47 s in the test suite) before."""
    import transformers
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)  # as the client read it at import
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained",
                        lambda *a, **k: pytest.fail("the hub was asked for a tokenizer"))
    assert longest_prompt_tokens("org/served-only", ADD) is None


# --- the server client against small real OpenAI-style stand-in servers -------------------------
OPENAI_FIELDS = {"model", "messages", "n", "max_tokens", "temperature", "top_p", "seed", "logprobs"}


def samples(request: Request) -> Reply:
    """n choices of three tokens each: "sample I of SEED" (its token ids and logprobs when asked)."""
    n = request.body["n"]
    return Reply([f"sample {i} of {request.body['seed']}" for i in range(n)], token_ids=[1, 2, 3],
                 logprobs=[-0.1] * 3, completion_tokens=3 * n)


@pytest.fixture
def chat_server(openai_stub):
    """Start stand-in /v1/chat/completions servers on 127.0.0.1 (stopped after the test):
    `fail_first` requests answer 503, `strict` ones answer 400 on fields OpenAI does not know."""

    def start(traffic: Traffic, fail_first: int = 0, strict: bool = False, delay_s: float = 0.03) -> OpenAIStub:
        return openai_stub(samples, traffic=traffic, fail_first=fail_first, delay_s=delay_s,
                           known_fields=OPENAI_FIELDS if strict else None)

    return start


def _prompts(count: int) -> list[Prompt]:
    return [Prompt(f"p{i}", [{"role": "user", "content": f"question {i}"}]) for i in range(count)]


def test_server_client_retries_drops_a_dead_url_spreads_and_bounds_concurrency(chat_server, capsys):
    traffic = Traffic()
    busy, calm = chat_server(traffic, fail_first=2), chat_server(traffic)
    dead = f"http://127.0.0.1:{free_port()}"
    gen = ServerGenerator(ServerConfig(base_urls=[dead, busy.base_url, calm.v1_url], model="m", concurrency=3,
                                       backoff_s=0.01))
    results = gen.generate(_prompts(24), SamplingParams(n=2, max_tokens=8, seed=5))
    assert [len(r.completions) for r in results] == [2] * 24
    assert results[0].completions[1].text == f"sample 1 of {prompt_seed(5, 'p0')}"
    assert results[0].completions[0].token_ids == [1, 2, 3] and results[0].num_tokens == 6
    # the two 503s and every refused connection were retried; the dead URL was dropped after 3
    assert busy.failed == 2 and busy.answered + calm.answered == 24
    assert dead not in gen.live and 3 <= gen.sent[dead] <= 3 + 3
    assert gen.retries == 2 + gen.sent[dead]
    assert f"dropping {dead}: 3 connection failures in a row" in " ".join(capsys.readouterr().err.split())
    # never more than `concurrency` requests in flight, and both live servers shared the work
    assert 2 <= traffic.max_in_flight <= 3
    assert min(busy.answered, calm.answered) >= 6, (busy.answered, calm.answered)


def test_server_client_gives_up_after_max_retries(chat_server):
    always_busy = chat_server(Traffic(), fail_first=100, delay_s=0)
    gen = ServerGenerator(ServerConfig(base_urls=[always_busy.base_url], model="m", max_retries=2, backoff_s=0.01))
    with pytest.raises(RufusError, match=r"did not answer after 3 attempts \(last error: .*HTTP 503"):
        gen.generate(_prompts(1), SamplingParams(max_tokens=4))
    assert len(always_busy.requests) == 3


def test_server_client_does_not_send_a_timed_out_request_again(chat_server):
    """A server slower than the timeout is still generating: a second copy would add to its load."""
    slow = chat_server(Traffic(), delay_s=2.0)
    gen = ServerGenerator(ServerConfig(base_urls=[slow.base_url], model="m", concurrency=1, timeout_s=0.5,
                                       backoff_s=0.01))
    with pytest.raises(RufusError, match=r"gave no answer within 0.5 s .*not sent again.*lower --concurrency"):
        gen.generate(_prompts(1), SamplingParams(n=4, max_tokens=8))
    assert gen.sent[slow.base_url] == 1 and gen.retries == 0


def test_server_client_leaves_out_return_token_ids_for_a_strict_endpoint(chat_server, capsys):
    strict = chat_server(Traffic(), strict=True, delay_s=0)
    gen = ServerGenerator(ServerConfig(base_urls=[strict.base_url], model="m", concurrency=1))
    results = gen.generate(_prompts(3), SamplingParams(n=2, max_tokens=8, seed=0))
    assert len(strict.requests) == 4, "one refusal, then every request without the field"
    assert ["return_token_ids" in b for b in strict.bodies] == [True, False, False, False]
    assert gen.send_token_ids is False
    for result in results:
        assert [c.token_ids for c in result.completions] == [[], []]
        assert [c.num_tokens for c in result.completions] == [3, 3]  # each choice's logprob entries
        assert result.num_tokens == 6
    assert "does not take return_token_ids" in capsys.readouterr().err
    single = gen.generate(_prompts(1), SamplingParams(n=1, max_tokens=8))[0]
    assert single.completions[0].num_tokens == 3


# --- the server command: one builder for the launcher and `rufus-train serve` ----------------------
def test_server_command_cpu_defaults_respect_the_callers_environment(monkeypatch):
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "8")
    args = VLLMServerArgs(model="/m", served_model_name="m", command=["vllm", "serve"], cpu=True, port=9,
                          extra_args=["--enable-chunked-prefill"], env={"EXTRA": "1"})
    env, argv = server_command(args)
    assert env == {"VLLM_TARGET_DEVICE": "cpu", "VLLM_CPU_NUM_OF_RESERVED_CPU": "0", "HF_HUB_OFFLINE": "1", "EXTRA": "1"}
    assert argv[:3] == ["vllm", "serve", "/m"]  # `vllm serve` takes the model positionally
    assert "--enforce-eager" in argv and "--no-enable-chunked-prefill" not in argv  # the caller chose chunking
    assert argv[argv.index("--dtype") + 1] == "bfloat16" and argv[argv.index("--port") + 1] == "9"
    assert "--weight-transfer-config" not in argv and "--enable-lora" not in argv


def test_server_command_weight_sync_and_lora_options():
    args = VLLMServerArgs(model="/m", command=["python", "-m", "vllm"], cpu=False, devices="2", weight_transfer="nccl",
                          lora_rank=300, max_loras=3)
    env, argv = server_command(args)
    assert env == {"VLLM_SERVER_DEV_MODE": "1", "CUDA_VISIBLE_DEVICES": "2", "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "1"}
    assert "--port" not in argv and "--enforce-eager" not in argv and "--dtype" not in argv
    assert argv[-5:] == ["--enable-lora", "--max-lora-rank", "320", "--max-loras", "3"]  # rank rounded up
    assert format_command(env, argv).startswith("VLLM_SERVER_DEV_MODE=1 CUDA_VISIBLE_DEVICES=2 ")
    with pytest.raises(RufusError, match="above the largest rank vLLM serves"):
        server_command(VLLMServerArgs(model="/m", command=["x"], cpu=False, lora_rank=1024))


# --- the launcher's cleanup, with a small real stand-in server -----------------------------------
STAND_IN = textwrap.dedent(
    f"""
    import json, os, subprocess, sys, time
    sys.path.insert(0, {str(Path(__file__).resolve().parent)!r})
    from openai_stub import OpenAIStub
    port = int(sys.argv[sys.argv.index("--port") + 1])
    mode = os.environ.get("STAND_IN_MODE", "serve")
    open(os.environ["STAND_IN_ENV_FILE"], "w").write(json.dumps({{"cvd": os.environ.get("CUDA_VISIBLE_DEVICES")}}))
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])  # an 'engine worker'
    if mode == "crash":
        sys.exit(3)
    if mode == "hang":
        time.sleep(600)
    OpenAIStub(models=["stand-in"], max_model_len=64, port=port).serve_forever()
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


@pytest.mark.spawn
def test_launcher_stops_the_whole_group_when_the_block_fails(stand_in):
    before = os.environ.get("CUDA_VISIBLE_DEVICES")
    with pytest.raises(ValueError), launch(stand_in(devices="3")) as server:
        pgid = server.pgid
        assert len(group_members(pgid)) >= 2  # the server and its worker
        assert httpx.get(f"{server.base_url}/v1/models").json()["data"][0]["max_model_len"] == 64
        assert check_context_fits(server.base_url, 56, 8) == "ok"
        with pytest.raises(RufusError, match=r"max_model_len \(64\)"):
            check_context_fits(server.base_url, 60, 8)
        raise ValueError("a failing test body")
    assert _gone(pgid), f"leaked processes {group_members(pgid)}"
    assert json.loads(stand_in.env_file.read_text())["cvd"] == "3"  # the server saw the devices
    assert os.environ.get("CUDA_VISIBLE_DEVICES") == before  # this process did not


@pytest.mark.spawn
def test_launcher_gives_up_on_a_server_that_never_gets_ready(stand_in):
    server = VLLMServer(stand_in(mode="hang", timeout=2.0))
    with pytest.raises(RufusError, match="not ready after 2 s"):
        server.start()
    assert server.process is None


@pytest.mark.spawn
def test_launcher_reports_a_server_that_dies(stand_in):
    with pytest.raises(RufusError, match="exited with code 3 before it was ready"):
        launch(stand_in(mode="crash"))


@pytest.mark.spawn
def test_atexit_hook_empties_the_group_when_the_parent_exits_without_stop(stand_in):
    """A run that ends without stop() (an uncaught error, sys.exit) stops its server at exit: the
    whole group, the stand-in's 'engine worker' included (PR_SET_PDEATHSIG reaches only the leader)."""
    cfg = stand_in()
    code = textwrap.dedent(
        f"""
        from rufus_data.generate.launcher import LaunchConfig, launch
        server = launch(LaunchConfig(model="stand-in", command={cfg.command!r}, cpu=False, ready_timeout_s=30))
        print(server.pgid, flush=True)
        raise SystemExit(0)  # no stop(): only the atexit hook can clean up
        """
    )
    parent = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=60)
    pgid = int(parent.stdout.split()[0])
    try:
        assert parent.returncode == 0, parent.stderr
        assert group_members(pgid) == [], f"leaked processes {group_members(pgid)}"
    finally:
        if group_members(pgid):
            os.killpg(pgid, signal.SIGKILL)


@pytest.mark.spawn
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
