"""How Rufus talks to an OpenAI-compatible server (vLLM, SGLang, TGI, a hosted API): the one place
for URLs, API keys, timeouts, connection limits, proxies and retries. Used by the generation
client (generate/server.py), the reward judge (rewards/llm_judge.py), the context probe
(generate/context.py), the launcher's readiness poll (generate/launcher.py), and in rufus_eval
the judge check (judge.py) and the lm-eval models (lm_eval_models.py).

- URLs: `root_url` / `v1_url` take a server root (`http://host:8000`) or its API base
  (`.../v1`, `.../v1/`) alike.
- Proxies: loopback (127.0.0.0/8, ::1, localhost) and the hosts of servers Rufus started itself
  (`started_here`, called by the launcher) are always reached directly; every other host follows
  the environment (HTTP_PROXY, HTTPS_PROXY, ALL_PROXY, NO_PROXY) as httpx reads it. A client knows
  its servers when it is made, so each direct one is an httpx mount without a proxy.
- Keys: OPENAI_API_KEY for the servers that generate (the variable lm-eval reads too),
  JUDGE_API_KEY for judges; sent as a Bearer token when set.
- Retries (`RetryPolicy`): connection errors, timeouts, 408, 429, 5xx and a 2xx that is no JSON
  (an HTML page) are tried again after a
  jittered exponential backoff, or after the server's `Retry-After`, within a bound on attempts
  and on the total time (each attempt's timeout is cut to the time left). Any other status
  raises `ServerRefused` at once: the server's own message, naming the URL and the model.

httpx + tenacity rather than the openai SDK (3.57, read for this): its retries run per client, that
is per base URL, while the generation client picks a URL for every attempt and drops dead ones,
so it would run with max_retries=0 anyway; it retries 409 too, has no bound on total time (only a
count of attempts of up to 10 minutes each) and gives up at once on a Retry-After over 2 minutes;
it is built on httpx2, not the httpx the rest of Rufus uses, and would add a core dependency for
typed responses whose vLLM fields (`token_ids`, `max_model_len`) are untyped extras anyway, while
`GET /version` is no OpenAI route at all. httpx's mounts give the per-host proxy choice; tenacity
runs the attempts (sync and async, with a sleep tests can replace)."""

from __future__ import annotations

import asyncio
import email.utils
import ipaddress
import os
import random
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import TypeVar

import httpx
import tenacity

from rufus_data.base.errors import RufusError

SERVER_KEY_VARIABLE = "OPENAI_API_KEY"
JUDGE_KEY_VARIABLE = "JUDGE_API_KEY"

T = TypeVar("T")


# --- URLs, keys, proxies ---------------------------------------------------------------------
def root_url(url: str) -> str:
    """The server's root (`http://host:port`, any path prefix kept) from it or from its `.../v1`."""
    return url.strip().rstrip("/").removesuffix("/v1")


def v1_url(url: str) -> str:
    """The OpenAI API base (`.../v1`) from the server's root or from the base itself."""
    return f"{root_url(url)}/v1"


def api_key(variable: str = SERVER_KEY_VARIABLE, default: str | None = None) -> str | None:
    """The API key from `variable` (an empty value counts as unset)."""
    return os.environ.get(variable) or default


_STARTED_HOSTS: set[str] = set()  # hosts of servers this process started (see started_here)


def started_here(url: str) -> None:
    """Mark `url`'s host as one Rufus started a server on: clients made afterwards reach it directly."""
    _STARTED_HOSTS.add(httpx.URL(url).host.lower())


def goes_direct(url: str) -> bool:
    """True for loopback hosts and hosts Rufus started a server on: never through a proxy."""
    host = httpx.URL(url).host.lower()
    if host == "localhost" or host.endswith(".localhost") or host in _STARTED_HOSTS:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _direct_mounts(urls: Iterable[str]) -> dict[str, None]:
    """httpx mounts that send these hosts over the plain transport, whatever the proxy variables say."""
    hosts = {httpx.URL(url).host for url in urls if goes_direct(url)}
    return {f"all://[{host}]" if ":" in host else f"all://{host}": None for host in hosts}


def _client_options(urls: Iterable[str], key: str | None, timeout_s: float, connect_s: float,
                    connections: int) -> dict:
    return {
        "headers": {"Authorization": f"Bearer {key}"} if key else {},
        "timeout": httpx.Timeout(timeout_s, connect=min(connect_s, timeout_s)),
        "limits": httpx.Limits(max_connections=connections, max_keepalive_connections=connections),
        "mounts": _direct_mounts(urls),
        "trust_env": True,  # proxy variables for every host the mounts above do not send directly
    }


def sync_client(urls: Iterable[str], *, key: str | None = None, timeout_s: float = 10.0, connect_s: float = 10.0,
                connections: int = 4) -> httpx.Client:
    """A synchronous client for the servers at `urls` (for its proxy choice; any path may follow)."""
    return httpx.Client(**_client_options(urls, key, timeout_s, connect_s, connections))


def async_client(urls: Iterable[str], *, key: str | None = None, timeout_s: float = 600.0, connect_s: float = 10.0,
                 connections: int = 32) -> httpx.AsyncClient:
    """An asynchronous client for the servers at `urls`, at most `connections` open at once."""
    return httpx.AsyncClient(**_client_options(urls, key, timeout_s, connect_s, connections))


# --- answers ----------------------------------------------------------------------------------
class ServerRefused(RufusError):
    """A status no retry changes (a 4xx other than 408 and 429): raised at once."""

    def __init__(self, url: str, model: str | None, status: int, message: str):
        self.url, self.model, self.status, self.server_message = url, model, status, message
        served = f" for model {model!r}" if model else ""
        super().__init__(f"{url} refused the request{served} (HTTP {status}): {message}")


class GaveUp(RufusError):
    """Every attempt failed on something worth retrying, or the time bound ran out."""

    def __init__(self, what: str, attempts: int, seconds: float, last_error: str):
        self.attempts, self.last_error = attempts, last_error
        super().__init__(f"{what} did not answer after {attempts} attempts (last error: {last_error}; "
                         f"{seconds:.1f} s in all); is the server up? check the URL")


class Transient(Exception):
    """A failure worth another attempt: 408, 429 or 5xx, with the server's Retry-After (seconds)."""

    def __init__(self, description: str, retry_after: float | None = None):
        super().__init__(description)
        self.retry_after = retry_after


def server_message(response: httpx.Response) -> str:
    """The error text of an OpenAI-style (`{"error": {"message"}}`) or vLLM-style answer, else its body."""
    try:
        payload = response.json()
    except ValueError:
        return response.text[:500]
    error = payload.get("error") if isinstance(payload, dict) else None
    message = error.get("message") if isinstance(error, dict) else error
    message = message or (payload.get("message") if isinstance(payload, dict) else None)
    return str(message or response.text)[:500]


def retry_after_s(response: httpx.Response) -> float | None:
    """The response's Retry-After in seconds (a number or an HTTP date); None when absent or unreadable."""
    value = response.headers.get("retry-after")
    if not value:
        return None
    try:
        return max(float(value), 0.0)
    except ValueError:
        pass
    try:
        return max(email.utils.parsedate_to_datetime(value).timestamp() - time.time(), 0.0)
    except (TypeError, ValueError):
        return None


def checked(response: httpx.Response, model: str | None = None) -> httpx.Response:
    """The response when it is a success holding JSON; `Transient` for 408/429/5xx and for a success
    that is no JSON (an HTML page: a proxy or a server still starting); `ServerRefused` for anything else."""
    status = response.status_code
    if 200 <= status < 300:
        if response.content.lstrip()[:1] not in (b"{", b"["):  # a proxy's or a login page's HTML, an empty body
            kind = response.headers.get("content-type", "no content type")
            raise Transient(f"{response.request.url}: HTTP {status} with {kind}, not JSON: "
                            f"{response.text[:200]!r}", retry_after_s(response))
        return response
    message = server_message(response)
    url = str(response.request.url)
    if status in (408, 429) or status >= 500:
        raise Transient(f"{url}: HTTP {status}: {message[:200]}", retry_after_s(response))
    raise ServerRefused(url, model, status, message)


def model_list(response: httpx.Response) -> list[dict]:
    """The `data` entries of a `GET /v1/models` answer (id, and max_model_len on vLLM)."""
    try:
        entries = response.json()["data"]
    except (ValueError, KeyError, TypeError):
        entries = None
    if not isinstance(entries, list) or not all(isinstance(e, dict) and "id" in e for e in entries):
        raise RufusError(f"{response.request.url} did not answer an OpenAI-style model list: {response.text[:200]!r}")
    return entries


# --- retries ----------------------------------------------------------------------------------
RETRIED = (Transient, httpx.TransportError)  # TransportError: refused or dropped connections, timeouts


@dataclass(frozen=True)
class RetryPolicy:
    """When to try again. `attempts` counts the first one (None: only `total_s` bounds them); the
    n-th retry waits `backoff_s * 2**(n-1)`, at most `max_backoff_s`, scaled by a random factor in
    [1 - jitter, 1 + jitter] so that many failed requests do not come back together; a server's
    Retry-After replaces that wait. No attempt starts, and no wait begins, past `total_s` seconds."""

    attempts: int | None = 6
    backoff_s: float = 0.5
    max_backoff_s: float = 8.0
    total_s: float = 120.0
    jitter: float = 0.2

    def wait_s(self, state: tenacity.RetryCallState) -> float:
        error = state.outcome.exception()
        if isinstance(error, Transient) and error.retry_after is not None:
            return error.retry_after
        delay = min(self.backoff_s * 2 ** (state.attempt_number - 1), self.max_backoff_s)
        return delay * random.uniform(1 - self.jitter, 1 + self.jitter)

    def _options(self) -> dict:
        stop = tenacity.stop_before_delay(self.total_s)
        if self.attempts is not None:
            stop = stop | tenacity.stop_after_attempt(self.attempts)
        return {"stop": stop, "wait": self.wait_s, "retry": tenacity.retry_if_exception_type(RETRIED)}

    def _left_s(self, started: float) -> float:
        return max(self.total_s - (time.monotonic() - started), 0.01)

    def call(self, attempt: Callable[[float], T], *, what: str, sleep: Callable[[float], None] = time.sleep) -> T:
        """`attempt(seconds_left)` until it returns, raises something not worth retrying, or the
        policy gives up (`GaveUp`, naming `what`)."""
        started = time.monotonic()
        try:
            return tenacity.Retrying(sleep=sleep, **self._options())(lambda: attempt(self._left_s(started)))
        except tenacity.RetryError as err:
            raise _gave_up(what, err, started) from None

    async def acall(self, attempt: Callable[[float], Awaitable[T]], *, what: str,
                    sleep: Callable[[float], Awaitable] = asyncio.sleep) -> T:
        """`call` for a coroutine function."""
        started = time.monotonic()

        async def once() -> T:  # a coroutine function, which tenacity awaits (a lambda it would not)
            return await attempt(self._left_s(started))

        try:
            return await tenacity.AsyncRetrying(sleep=sleep, **self._options())(once)
        except tenacity.RetryError as err:
            raise _gave_up(what, err, started) from None


def _gave_up(what: str, err: tenacity.RetryError, started: float) -> GaveUp:
    error = err.last_attempt.exception()
    detail = str(error) if isinstance(error, Transient) else f"{_where(error)}{type(error).__name__}: {error}"
    return GaveUp(what, err.last_attempt.attempt_number, time.monotonic() - started, detail)


def _where(error: BaseException) -> str:
    """`URL: ` of the request a transport error happened to, when httpx recorded it."""
    try:
        return f"{error.request.url}: " if isinstance(error, httpx.RequestError) else ""
    except RuntimeError:  # httpx raises this when the error carries no request
        return ""


# a quick question to a server (its model list, its version): a few tries within half a minute
PROBE = RetryPolicy(attempts=3, backoff_s=0.5, total_s=30.0)


def capped(timeout: httpx.Timeout, left_s: float) -> httpx.Timeout:
    """`timeout` with every phase cut to the `left_s` seconds a policy has left."""
    def cap(value: float | None) -> float:
        return left_s if value is None else min(value, left_s)

    return httpx.Timeout(connect=cap(timeout.connect), read=cap(timeout.read), write=cap(timeout.write),
                         pool=cap(timeout.pool))


def request(http: httpx.Client, method: str, url: str, retry: RetryPolicy = PROBE, *, model: str | None = None,
            json: dict | None = None, sleep: Callable[[float], None] = time.sleep) -> httpx.Response:
    """One request with `retry`: a successful response, or `ServerRefused` / `GaveUp`."""
    def attempt(left_s: float) -> httpx.Response:
        return checked(http.request(method, url, json=json, timeout=capped(http.timeout, left_s)), model)

    return retry.call(attempt, what=_what(method, url, model), sleep=sleep)


async def arequest(http: httpx.AsyncClient, method: str, url: str, retry: RetryPolicy = PROBE, *,
                   model: str | None = None, json: dict | None = None,
                   sleep: Callable[[float], Awaitable] = asyncio.sleep) -> httpx.Response:
    """`request` on an asynchronous client."""
    async def attempt(left_s: float) -> httpx.Response:
        return checked(await http.request(method, url, json=json, timeout=capped(http.timeout, left_s)), model)

    return await retry.acall(attempt, what=_what(method, url, model), sleep=sleep)


def _what(method: str, url: str, model: str | None) -> str:
    return f"{method} {url}" + (f" (model {model!r})" if model else "")


# --- the two questions every caller asks a server ---------------------------------------------
def served_models(url: str, *, key: str | None = None, retry: RetryPolicy = PROBE,
                  timeout_s: float = 5.0) -> list[dict]:
    """`GET /v1/models` of the server at `url` (root or /v1): its entries; `GaveUp`, `ServerRefused`
    or a RufusError for an answer that is no model list."""
    with sync_client([url], key=key, timeout_s=timeout_s) as http:
        return model_list(request(http, "GET", f"{v1_url(url)}/models", retry))


def server_version(url: str, *, key: str | None = None, retry: RetryPolicy = PROBE,
                   timeout_s: float = 5.0) -> str | None:
    """The version a vLLM server reports (`GET /version`); None when it has none (not vLLM) or is silent."""
    with sync_client([url], key=key, timeout_s=timeout_s) as http:
        try:
            version = request(http, "GET", f"{root_url(url)}/version", retry).json().get("version")
        except (RufusError, ValueError, AttributeError):
            return None
    return None if version is None else str(version)
