"""The async LLM judge against a real HTTP server on 127.0.0.1 with scripted answers, delays and failures."""

from __future__ import annotations

import asyncio
import re
import threading
import time

import pytest
from openai_stub import Reply, Request

from rufus_data.rewards import LLMJudgeReward, parse_score


class ScriptedJudge:
    """The judge's answers, scripted by a `[[case:NAME]]` tag in the graded answer, served by a
    stand-in OpenAI server (tests/openai_stub.py) that records every request."""

    def __init__(self, openai_stub):
        self.attempts: dict[str, int] = {}
        self.lock = threading.Lock()
        self.stub = openai_stub(self.respond, models=["judge-model", "other"])

    def respond(self, request: Request) -> Reply:
        with self.lock:
            case = re.search(r"\[\[case:(\w+)\]\]", request.body["messages"][0]["content"]).group(1)
            attempt = self.attempts[case] = self.attempts.get(case, 0) + 1
        status, text, delay = self.script(case, attempt)
        if case == "busy":  # hold requests until 16 are in flight (or 5 s), then a little longer
            deadline = time.monotonic() + 5
            while self.stub.traffic.in_flight < 16 and time.monotonic() < deadline:
                time.sleep(0.01)
        return Reply(text, status=status, delay_s=delay)

    @staticmethod
    def script(case: str, attempt: int) -> tuple[int, str, float]:
        if case.startswith("score"):  # score8, score7, score6, ...
            return 200, f"The answer matches the reference.\nScore: {case[5:]}", 0.0
        if case == "flaky":  # HTTP 500 twice, then an answer
            return (500, "", 0.0) if attempt <= 2 else (200, "Solid. [[9]]", 0.0)
        if case == "down":
            return 500, "", 0.0
        if case == "slow":  # first attempt past the client timeout
            return 200, "Score: 8", 1.5 if attempt == 1 else 0.0
        if case == "garbage":
            return 200, "I cannot decide on this one.", 0.0
        if case == "busy":
            return 200, "Score: 10", 0.2
        raise AssertionError(case)

    @property
    def url(self) -> str:
        return self.stub.v1_url

    @property
    def bodies(self) -> list[dict]:
        return self.stub.bodies

    @property
    def headers(self) -> list[str | None]:
        return [request.headers.get("Authorization") for request in self.stub.requests]

    @property
    def max_in_flight(self) -> int:
        return self.stub.max_in_flight


@pytest.fixture
def judge_server(openai_stub, monkeypatch):
    server = ScriptedJudge(openai_stub)
    monkeypatch.setenv("JUDGE_BASE_URL", server.url)
    monkeypatch.delenv("JUDGE_MODEL", raising=False)
    monkeypatch.delenv("JUDGE_API_KEY", raising=False)
    return server


class RecordingSleep:
    """Injected instead of asyncio.sleep: records the backoff schedule without waiting it out."""

    def __init__(self):
        self.calls: list[float] = []

    async def __call__(self, seconds: float):
        self.calls.append(seconds)


class FakeClock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        self.now += 1.5
        return self.now


JITTERED_1_2 = [pytest.approx(1.0, rel=0.2), pytest.approx(2.0, rel=0.2)]  # the backoff, with its jitter


def _judge(completions, timeout_s=0.5, **columns):
    sleep = RecordingSleep()
    reward = LLMJudgeReward(sleep=sleep, clock=FakeClock(), timeout_s=timeout_s)
    metrics = {}
    scores = asyncio.run(reward(prompts=["What is 2+2?"] * len(completions), completions=completions,
                                log_metric=metrics.__setitem__, **columns))
    return scores, sleep.calls, metrics


def test_defaults_are_the_fixed_constants():
    reward = LLMJudgeReward()
    assert (reward.concurrency, reward.timeout_s, reward.retries, reward.backoff_s, reward.max_tokens, reward.threshold) == (
        16, 120.0, 2, 1.0, 2048, 7)
    from trl.trainer.utils import is_async_callable

    assert is_async_callable(reward)  # TRL runs it on its async loop


def test_threshold_reference_fallback_and_request_shape(judge_server):
    scores, sleeps, metrics = _judge(
        ["[[case:score8]]", "[[case:score7]]", "[[case:score6]]", "<think>[[case:score9]]"],
        solution=["four", "four", "four", "four"],
    )
    assert scores == [1.0, 1.0, 0.0, 0.0] and sleeps == []  # >= 7 passes; an unclosed <think> is 0.0 unjudged
    body = judge_server.bodies[0]
    assert body["model"] == "judge-model" and body["max_tokens"] == 2048
    assert "four" in body["messages"][0]["content"]  # reference fell back to the solution column
    assert judge_server.headers[0] == "Bearer EMPTY"
    assert metrics["llm_judge/failed"] == 0.0 and metrics["llm_judge/seconds"] == 1.5
    assert len(judge_server.bodies) == 3


def test_reference_column_and_env_model(judge_server, monkeypatch):
    monkeypatch.setenv("JUDGE_MODEL", "chosen-model")
    monkeypatch.setenv("JUDGE_API_KEY", "k-123")
    scores, _, _ = _judge(["[[case:score9]]"], reference=["REF-ANSWER"], solution=["SOLUTION"])
    assert scores == [1.0]
    body = judge_server.bodies[0]
    assert body["model"] == "chosen-model" and "REF-ANSWER" in body["messages"][0]["content"]
    assert "SOLUTION" not in body["messages"][0]["content"] and judge_server.headers[0] == "Bearer k-123"


def test_retries_with_backoff_then_success(judge_server):
    scores, sleeps, _ = _judge(["[[case:flaky]]"])
    assert scores == [1.0] and sleeps == JITTERED_1_2 and judge_server.attempts["flaky"] == 3


def test_http_500_every_time_gives_none_and_is_counted(judge_server):
    scores, sleeps, metrics = _judge(["[[case:down]]", "[[case:score8]]"])
    assert scores == [None, 1.0] and sleeps == JITTERED_1_2 and judge_server.attempts["down"] == 3
    assert metrics["llm_judge/failed"] == 1.0 and metrics["llm_judge/unscored"] == 1.0


def test_timeout_is_retried(judge_server):
    scores, sleeps, _ = _judge(["[[case:slow]]"])
    # the first attempt, answered after 1.5 s, was given up at the 0.5 s timeout: had the client
    # waited for it, that answer would have scored with one attempt (no clock bound: it raced load)
    assert scores == [1.0] and sleeps == JITTERED_1_2[:1] and judge_server.attempts["slow"] == 2


def test_unparsable_answer_gives_none_and_is_counted(judge_server):
    scores, sleeps, metrics = _judge(["[[case:garbage]]", "[[case:score2]]"])
    assert scores == [None, 0.0] and sleeps == [] and metrics["llm_judge/unparsable"] == 1.0


def test_at_most_16_requests_in_flight(judge_server):
    scores, _, _ = _judge([f"[[case:busy]] answer {i}" for i in range(32)], timeout_s=30)
    assert scores == [1.0] * 32
    assert judge_server.max_in_flight == 16  # the server holds requests until 16 arrive: never a 17th


def test_only_label_and_parse_score():
    reward = LLMJudgeReward(only_label="chat")
    assert asyncio.run(reward(completions=["x", "y"], label=["math", "code"])) == [None, None]  # never connects
    assert parse_score("Reasoning...\nScore: 8") == 8.0
    assert parse_score("**Score:** 6/10") == 6.0
    assert parse_score("final [[7]]") == 7.0
    assert parse_score("I give it 9/10") == 9.0
    assert parse_score("no number") is None
    assert parse_score("Score: 42") is None


def test_explicit_connection_wins_over_the_environment(judge_server, monkeypatch):
    """An evaluation suite pins its judge through arguments; JUDGE_* variables are only the fallback."""
    url = judge_server.url
    monkeypatch.setenv("JUDGE_BASE_URL", "http://127.0.0.1:9/v1")  # nothing listens there
    monkeypatch.setenv("JUDGE_MODEL", "env-model")
    reward = LLMJudgeReward(base_url=url, model="pinned-model", sleep=RecordingSleep(), timeout_s=5)
    scores = asyncio.run(reward(prompts=["q"], completions=["[[case:score8]]"], reference=["r"]))
    assert scores == [1.0] and judge_server.bodies[0]["model"] == "pinned-model"
    assert reward.connection() == (url, "pinned-model", "EMPTY")
    assert LLMJudgeReward().connection() == ("http://127.0.0.1:9/v1", "env-model", "EMPTY")


def test_default_connection_without_environment(monkeypatch):
    for name in ("JUDGE_BASE_URL", "JUDGE_MODEL", "JUDGE_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    assert LLMJudgeReward().connection() == ("http://localhost:8001/v1", None, "EMPTY")
    monkeypatch.setenv("JUDGE_BASE_URL", "")  # empty counts as unset
    assert LLMJudgeReward().connection()[0] == "http://localhost:8001/v1"
