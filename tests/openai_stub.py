"""A stand-in OpenAI-compatible server for tests: a real HTTP server on 127.0.0.1 that answers
GET /v1/models, POST /v1/chat/completions and POST /v1/completions the way vLLM does, so the
clients under test (the generation client, the LLM judge, the context checks) run unchanged.

A test scripts the replies with a function of the request (text per choice, HTTP status,
headers, delay, token ids, logprobs), can make the first requests fail, can refuse request
fields a strict OpenAI endpoint does not know or models it does not serve, and reads back every
request it received (with the time it arrived). The `openai_stub` fixture (conftest.py) starts
them and stops them after the test; a subprocess can serve one in the foreground with
`serve_forever()`. A stub also stands in for an HTTP proxy: a client that takes it for one asks
for absolute URLs, which `targets` records, and gets the stub's answers."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from email.message import Message
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

CHAT, COMPLETIONS, MODELS = "/v1/chat/completions", "/v1/completions", "/v1/models"


@dataclass
class Request:
    """One POST the stub received."""

    path: str
    body: dict
    headers: Message  # case-insensitive: headers.get("Authorization")
    received_at: float = 0.0  # time.monotonic() when it arrived

    @property
    def text(self) -> str:
        """The first message's content (chat) or the prompt (completions)."""
        if self.path == CHAT:
            return self.body["messages"][0]["content"]
        prompt = self.body["prompt"]
        return prompt if isinstance(prompt, str) else prompt[0]


@dataclass
class Reply:
    """What the stub answers to one request."""

    content: str | Sequence[str] = ""  # the text of every choice, or one text per choice (n of them)
    status: int = 200  # anything else: an OpenAI-style error body carrying `error`
    error: str = "scripted failure"
    headers: dict[str, str] | None = None  # sent with the answer (Retry-After, ...)
    delay_s: float = 0.0  # before answering (a client timeout can be made to pass)
    finish_reason: str = "stop"
    token_ids: list[int] | None = None  # each choice's, sent when the request asks (return_token_ids)
    logprobs: list[float] | None = None  # each choice's per-token logprobs, sent when the request asks
    completion_tokens: int | None = None  # usage.completion_tokens, when given


Responder = Callable[[Request], "Reply | str"]


class Traffic:
    """Requests in flight at one or more stubs (pass one Traffic to several to count them together)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.in_flight = 0
        self.max_in_flight = 0


class OpenAIStub:
    """A stand-in server. `respond` maps each request to a Reply (or a plain text); the default
    answers "ok". `models` are the served names GET /v1/models lists (with `max_model_len`
    when given); the first `fail_first` requests answer `fail_status`; with `known_fields`, a
    request field outside it is refused with HTTP 400 naming it, as OpenAI does; with
    `known_models_only`, a request for a model not in `models` gets vLLM's 404; `delay_s`
    holds every request (in flight) before it is answered."""

    def __init__(self, respond: Responder | None = None, *, models: Sequence[str] = ("stub",),
                 max_model_len: int | None = None, fail_first: int = 0, fail_status: int = 503,
                 known_fields: set[str] | None = None, known_models_only: bool = False, delay_s: float = 0.0,
                 traffic: Traffic | None = None, port: int = 0):
        self.respond = respond or (lambda request: Reply("ok"))
        self.models, self.max_model_len = list(models), max_model_len
        self.fail_first, self.fail_status = fail_first, fail_status
        self.known_fields, self.known_models_only, self.delay_s = known_fields, known_models_only, delay_s
        self.traffic = traffic or Traffic()
        self.requests: list[Request] = []  # the POSTs
        self.targets: list[str] = []  # every request target: a path, or the absolute URL a proxy is asked for
        self.answered = 0  # requests answered 200
        self.failed = 0  # requests answered with an error status
        self.httpd = ThreadingHTTPServer(("127.0.0.1", port), self._handler())
        self.httpd.daemon_threads = True
        self._thread: threading.Thread | None = None

    # ---------------------------------------------------------------- addresses and lifetime
    @property
    def base_url(self) -> str:
        """http://127.0.0.1:PORT, without /v1 (as the launcher's VLLMServer.base_url)."""
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    @property
    def v1_url(self) -> str:
        """The OpenAI base URL clients are given (…/v1)."""
        return f"{self.base_url}/v1"

    @property
    def bodies(self) -> list[dict]:
        return [request.body for request in self.requests]

    @property
    def max_in_flight(self) -> int:
        return self.traffic.max_in_flight

    def start(self) -> OpenAIStub:
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self._thread.start()
        return self

    def serve_forever(self) -> None:
        self.httpd.serve_forever()

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    # ---------------------------------------------------------------- answers
    def models_payload(self) -> dict:
        extra = {"max_model_len": self.max_model_len} if self.max_model_len is not None else {}
        return {"object": "list", "data": [{"id": name, "object": "model", "owned_by": "tests", **extra}
                                           for name in self.models]}

    def _answer(self, request: Request, fail: bool) -> tuple[int, dict, float, dict[str, str]]:
        """(status, payload, delay, headers) for one POST (`fail`: one of the first `fail_first`)."""
        unknown = sorted(set(request.body) - self.known_fields) if self.known_fields is not None else []
        if unknown:
            return 400, _error(f"Unrecognized request argument supplied: {unknown[0]}", 400), 0.0, {}
        if self.known_models_only and request.body.get("model") not in self.models:
            return 404, _error(f"The model `{request.body.get('model')}` does not exist.", 404), 0.0, {}
        if fail:
            return self.fail_status, _error("busy", self.fail_status), 0.0, {}
        reply = self.respond(request)
        reply = Reply(reply) if isinstance(reply, str) else reply
        if reply.status != 200:
            return reply.status, _error(reply.error, reply.status), reply.delay_s, reply.headers or {}
        return 200, _choices_payload(request, reply), reply.delay_s, reply.headers or {}

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _send(self, status: int, payload: dict, headers: dict[str, str] | None = None) -> None:
                data = json.dumps(payload).encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    for name, value in (headers or {}).items():
                        self.send_header(name, value)
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (its timeout)

            def _route(self) -> str:
                with stub.traffic.lock:
                    stub.targets.append(self.path)
                return urlsplit(self.path).path

            def do_GET(self):
                if self._route() == MODELS:
                    self._send(200, stub.models_payload())
                else:
                    self._send(404, _error(f"no route GET {self.path}", 404))

            def do_POST(self):
                path = self._route()
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])) or b"{}")
                if path not in (CHAT, COMPLETIONS):
                    self._send(404, _error(f"no route POST {self.path}", 404))
                    return
                request, traffic = Request(path, body, self.headers, time.monotonic()), stub.traffic
                with traffic.lock:
                    traffic.in_flight += 1
                    traffic.max_in_flight = max(traffic.max_in_flight, traffic.in_flight)
                    stub.requests.append(request)
                    fail = len(stub.requests) <= stub.fail_first
                counted_out = False
                try:
                    time.sleep(stub.delay_s)
                    try:
                        status, payload, delay, headers = stub._answer(request, fail)
                    except Exception as err:  # noqa: BLE001 - a broken script shows as a 500 naming it
                        status, payload, delay, headers = 500, _error(f"the test's responder failed: {err!r}", 500), 0.0, {}
                    time.sleep(delay)
                    with traffic.lock:
                        if status == 200:
                            stub.answered += 1
                        else:
                            stub.failed += 1
                        # out of flight before the answer leaves: the client may send its next request as
                        # soon as this one arrives, before this thread would run again on a busy machine
                        traffic.in_flight -= 1
                        counted_out = True
                    self._send(status, payload, headers)
                finally:
                    if not counted_out:
                        with traffic.lock:
                            traffic.in_flight -= 1

        return Handler


def _error(message: str, status: int) -> dict:
    return {"error": {"message": message, "type": "BadRequestError" if status == 400 else "error", "code": status}}


def _choices_payload(request: Request, reply: Reply) -> dict:
    """The OpenAI response body: one choice per requested sample (`n`)."""
    n = request.body.get("n") or 1
    texts = [reply.content] * n if isinstance(reply.content, str) else list(reply.content)
    assert len(texts) == n, f"the reply has {len(texts)} texts for n={n}"
    want_ids = bool(request.body.get("return_token_ids")) and reply.token_ids is not None
    want_logprobs = bool(request.body.get("logprobs")) and reply.logprobs is not None
    choices = []
    for index, text in enumerate(texts):
        choice: dict = {"index": index, "finish_reason": reply.finish_reason}
        if request.path == CHAT:
            choice["message"] = {"role": "assistant", "content": text}
            if want_logprobs:
                choice["logprobs"] = {"content": [{"token": f"t{i}", "logprob": lp, "top_logprobs": []}
                                                  for i, lp in enumerate(reply.logprobs)]}
        else:
            choice["text"] = text
            if want_logprobs:
                tokens = [f"t{i}" for i in range(len(reply.logprobs))]
                choice["logprobs"] = {"tokens": tokens, "token_logprobs": list(reply.logprobs),
                                      "top_logprobs": [{t: lp} for t, lp in zip(tokens, reply.logprobs)],
                                      "text_offset": list(range(len(tokens)))}
        if want_ids:
            choice["token_ids"] = list(reply.token_ids)
        choices.append(choice)
    payload: dict = {"object": "chat.completion" if request.path == CHAT else "text_completion",
                     "model": request.body.get("model"), "choices": choices}
    if reply.completion_tokens is not None:
        payload["usage"] = {"completion_tokens": reply.completion_tokens}
    return payload
