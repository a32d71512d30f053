"""The one client for OpenAI-compatible servers (rufus_data/models/openai_api.py), against the stand-in
server (tests/openai_stub.py): which failures are retried and how long that may take, and which
hosts go through a proxy. The generation client and the reward judge are driven through it too."""

from __future__ import annotations

import asyncio
import socket
import time

import pytest
from openai_stub import Reply

from rufus_data.base.errors import RufusError
from rufus_data.generate import Prompt, SamplingParams
from rufus_data.generate.context import server_max_model_len
from rufus_data.generate.server import ServerConfig, ServerGenerator
from rufus_data.models.openai_api import (
    GaveUp,
    RetryPolicy,
    ServerRefused,
    arequest,
    async_client,
    goes_direct,
    request,
    root_url,
    served_models,
    started_here,
    sync_client,
    v1_url,
)
from rufus_data.rewards import LLMJudgeReward

CHAT_BODY = {"model": "stub", "messages": [{"role": "user", "content": "hi"}]}
QUICK = RetryPolicy(attempts=4, backoff_s=0.01, total_s=20.0)  # short waits: the tests time the long ones


def test_urls_have_one_normal_form():
    for url in ("http://h:8000", "http://h:8000/", "http://h:8000/v1", "http://h:8000/v1/", " http://h:8000/v1 "):
        assert (root_url(url), v1_url(url)) == ("http://h:8000", "http://h:8000/v1")
    assert v1_url("https://gateway/llm") == "https://gateway/llm/v1"  # a path prefix is kept


def test_unknown_model_fails_at_once_naming_it(openai_stub):
    stub = openai_stub(models=["served"], known_models_only=True)
    with sync_client([stub.base_url]) as http, pytest.raises(ServerRefused) as err:
        request(http, "POST", f"{stub.v1_url}/chat/completions", QUICK, model="missing", json={**CHAT_BODY, "model": "missing"})
    assert err.value.status == 404 and len(stub.requests) == 1  # no retry
    assert str(err.value) == (f"{stub.v1_url}/chat/completions refused the request for model 'missing' (HTTP 404): "
                              "The model `missing` does not exist.")


def test_generation_and_judge_stop_at_once_on_an_unknown_model(openai_stub):
    stub = openai_stub(models=["served"], known_models_only=True)
    generator = ServerGenerator(ServerConfig(base_urls=[stub.v1_url], model="missing", concurrency=1))
    prompt = Prompt("p0", [{"role": "user", "content": "hi"}])
    with pytest.raises(RufusError, match=r"prompt p0: .* for model 'missing' \(HTTP 404\): The model `missing` does"):
        generator.generate([prompt], SamplingParams(max_tokens=4))
    assert len(stub.requests) == 1 and generator.retries == 0
    judge = LLMJudgeReward(base_url=stub.base_url, model="missing")
    with pytest.raises(RufusError, match="for model 'missing' \\(HTTP 404\\)"):
        asyncio.run(judge(prompts=["q"], completions=["a"], reference=["r"]))
    assert len(stub.requests) == 2  # the judge's one request: not retried


def test_judge_leaves_a_refused_request_unscored_without_retrying(openai_stub):
    """A 400 is about that one request (an answer too long for the judge's context, say): None, counted."""
    stub = openai_stub(lambda r: Reply(status=400, error="too long") if "[[refuse]]" in r.text else Reply("Score: 9"))
    metrics = {}
    scores = asyncio.run(LLMJudgeReward(base_url=stub.v1_url, model="stub")(
        prompts=["q", "q"], completions=["[[refuse]]", "short"], reference=["r", "r"], log_metric=metrics.__setitem__))
    assert scores == [None, 1.0] and len(stub.requests) == 2 and metrics["llm_judge/failed"] == 1.0


def test_429_waits_for_retry_after(openai_stub):
    def respond(r):
        return Reply(status=429, error="slow down", headers={"Retry-After": "1"}) if len(stub.requests) == 1 else "ok"

    stub = openai_stub(respond)
    with sync_client([stub.base_url]) as http:
        answer = request(http, "POST", f"{stub.v1_url}/chat/completions", QUICK, json=CHAT_BODY).json()
    assert answer["choices"][0]["message"]["content"] == "ok"
    first, second = stub.requests
    assert 0.95 <= second.received_at - first.received_at < 3.0  # the server's 1 s, not the policy's 0.01 s


def test_500_is_retried_then_succeeds(openai_stub):
    stub = openai_stub(fail_first=2, fail_status=500)

    async def ask() -> dict:
        async with async_client([stub.base_url]) as http:
            return (await arequest(http, "POST", f"{stub.v1_url}/chat/completions", QUICK, json=CHAT_BODY)).json()

    assert asyncio.run(ask())["choices"][0]["message"]["content"] == "ok"
    assert (stub.failed, stub.answered, len(stub.requests)) == (2, 1, 3)


def test_retries_stop_after_the_attempts(openai_stub):
    stub = openai_stub(fail_first=100, fail_status=503)
    with sync_client([stub.base_url]) as http, pytest.raises(GaveUp, match=r"after 4 attempts \(last error: .*HTTP 503"):
        request(http, "POST", f"{stub.v1_url}/chat/completions", QUICK, json=CHAT_BODY)
    assert len(stub.requests) == 4


@pytest.fixture
def html_then_json():
    """A server whose first two answers are a 200 HTML page (a proxy's, a server still starting),
    then an OpenAI model list."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
    from threading import Thread

    seen = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # http.server calls it by this name
            seen.append(self.path)
            html = len(seen) <= 2
            body = b"<html><body>Please log in</body></html>" if html else b'{"data": [{"id": "m"}]}'
            self.send_response(200)
            self.send_header("Content-Type", "text/html" if html else "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}", seen
    server.shutdown()
    server.server_close()


def test_a_200_html_page_is_retried_as_a_transient_answer_then_named(html_then_json):
    """issue #47, item 11: an HTML 200 was no retry and ended in a JSON traceback."""
    url, seen = html_then_json
    with sync_client([url]) as http:
        assert request(http, "GET", f"{url}/v1/models", QUICK).json() == {"data": [{"id": "m"}]}
        assert len(seen) == 3  # two HTML pages tried again
        seen.clear()
        one = RetryPolicy(attempts=1, backoff_s=0.01, total_s=5)
        with pytest.raises(GaveUp, match=r"HTTP 200 with text/html, not JSON: '<html><body>Please log in"):
            request(http, "GET", f"{url}/v1/models", one)


@pytest.fixture
def silent_server():
    """A port that takes connections (the kernel's backlog) and never answers a byte."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(8)
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"


def test_a_server_that_never_answers_fails_within_the_bound(silent_server):
    bounded = RetryPolicy(attempts=None, backoff_s=0.05, total_s=1.5)
    started = time.monotonic()
    read_timeouts = []
    with sync_client([silent_server], timeout_s=60.0) as http, pytest.raises(GaveUp, match="ReadTimeout"):
        real_request = http.request
        http.request = lambda *a, timeout, **k: read_timeouts.append(timeout.read) or real_request(*a, timeout=timeout, **k)
        request(http, "GET", f"{silent_server}/v1/models", bounded)  # each attempt gets only the time left
    # every attempt waited within the 1.5 s bound, never the 60 s client timeout (read, not timed)
    assert read_timeouts and all(t <= 1.5 for t in read_timeouts) and time.monotonic() - started >= 1.0


# --- proxies ---------------------------------------------------------------------------------------------
PROXY_VARIABLES = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY", "http_proxy", "https_proxy", "all_proxy",
                   "no_proxy")


@pytest.fixture
def proxy_env(monkeypatch):
    """`proxy_env(url)`: every proxy variable cleared, then HTTP_PROXY (and HTTPS_PROXY) set to `url`."""
    for name in PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr("rufus_data.models.openai_api._STARTED_HOSTS", set())

    def use(url: str) -> None:
        monkeypatch.setenv("HTTP_PROXY", url)
        monkeypatch.setenv("HTTPS_PROXY", url)

    return use


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_loopback_never_goes_through_the_proxy(openai_stub, proxy_env):
    proxy_env(f"http://127.0.0.1:{_closed_port()}")  # nothing listens: a proxied request would fail
    stub = openai_stub(lambda r: "Score: 8", models=["judge"], max_model_len=512)
    assert [m["id"] for m in served_models(stub.base_url, retry=QUICK)] == ["judge"]
    assert server_max_model_len(stub.v1_url) == 512
    generator = ServerGenerator(ServerConfig(base_urls=[stub.base_url], model="judge"))
    results = generator.generate([Prompt("p", [{"role": "user", "content": "hi"}])], SamplingParams(max_tokens=4))
    assert results[0].completions[0].text == "Score: 8"
    judged = asyncio.run(LLMJudgeReward(base_url=stub.v1_url)(prompts=["q"], completions=["a"], reference=["r"]))
    assert judged == [1.0] and generator.retries == 0
    assert all(goes_direct(url) for url in ("http://127.0.0.5:1", "http://[::1]:1", "http://localhost:1"))


def test_other_hosts_go_through_the_proxy(openai_stub, proxy_env):
    proxy = openai_stub(models=["seen-through-the-proxy"])
    proxy_env(proxy.base_url)
    models = served_models("http://judge.example:8000/v1", retry=QUICK)
    assert [m["id"] for m in models] == ["seen-through-the-proxy"]
    assert proxy.targets == ["http://judge.example:8000/v1/models"]  # the proxy was asked for the absolute URL


def test_a_host_rufus_started_a_server_on_goes_direct(openai_stub, proxy_env):
    """0.0.0.0 reaches this machine's listeners but is no loopback address: proxied until the
    launcher's `started_here` marks it."""
    proxy, server = openai_stub(models=["proxy"]), openai_stub(models=["server"])
    proxy_env(proxy.base_url)
    url = server.base_url.replace("127.0.0.1", "0.0.0.0")
    assert [m["id"] for m in served_models(url, retry=QUICK)] == ["proxy"]
    started_here(url)
    assert [m["id"] for m in served_models(url, retry=QUICK)] == ["server"]
    assert (proxy.targets, server.targets) == ([f"{url}/v1/models"], ["/v1/models"])
