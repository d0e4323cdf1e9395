"""`openai_judge`: the rubric and pairwise judges on an OpenAI-compatible chat endpoint (a local stub)."""

import pytest

from lmrl.rewards import RewardError, RewardSet, make_reward
from tests.rewards.stub_server import StubServer


def chat(content):
    return 200, {"choices": [{"message": {"role": "assistant", "content": content}}]}


def rubric_grader(path, payload, i):
    # grade by the answer: "good" meets criterion 1 fully (10/10), criterion 2 half (5/10); else zeros
    text = payload["messages"][0]["content"]
    answer = text.split("[Answer]\n", 1)[1].split("\n\n[Criteria]", 1)[0]
    if answer == "garbled":
        return chat("I cannot decide.")
    return chat("Fine. [[1: 10]] [[2: 5]]" if answer == "good" else "[[1: 0]] [[2: 0]]")


def test_rubric_kind_posts_chat_completions_and_scores_with_the_rubric_parsing(monkeypatch):
    monkeypatch.setenv("LMRL_TEST_KEY", "k")
    with StubServer(rubric_grader) as server:
        rs = RewardSet(
            ["openai_judge"],
            reward_kwargs={
                "openai_judge": {
                    "url": server.url(""),
                    "model": "stub-7b",
                    "api_key_env": "LMRL_TEST_KEY",
                    "backoff_s": 0.01,
                    "criteria": [{"title": "Correct", "weight": 3}, {"title": "Concise", "weight": 1}],
                }
            },
        )
        total, _, metrics = rs.compute(["What is 2+2?"] * 3, ["good", "bad", "garbled"])
    # good: (3 * 10/10 + 1 * 5/10) / (3 + 1) = 3.5 / 4 = 0.875; bad: 0; garbled: unparsed -> fallback 0
    assert total.tolist() == pytest.approx([0.875, 0.0, 0.0], abs=1e-6)
    assert metrics["reward/openai_judge/parse_failures"] == 1.0
    path, payload, headers = server.requests[0]
    assert path == "/v1/chat/completions" and headers["Authorization"] == "Bearer k"
    assert payload["model"] == "stub-7b" and payload["temperature"] == 0
    assert "What is 2+2?" in payload["messages"][0]["content"] and "1. Correct" in payload["messages"][0]["content"]


def pairwise_grader(path, payload, i):
    # prefers the answer "right" in whichever position it stands; never decides between two others
    text = payload["messages"][0]["content"]
    a = text.split("[Answer of assistant A]\n", 1)[1].split("\n\n", 1)[0]
    b = text.split("[Answer of assistant B]\n", 1)[1]
    return chat("[[A]]" if a == "right" else "[[B]]" if b == "right" else "[[C]]")


def test_pairwise_kind_compares_with_the_reference_in_both_orders():
    with StubServer(pairwise_grader) as server:
        fn = make_reward("openai_judge", url=server.url(""), model="m", kind="pairwise", reference="ref")
        rewards = fn(["q"] * 3, ["right", "wrong", "meh"], ref=["wrong", "right", "meh2"])
    # win in both orders 1.0; loss in both 0.0; a tie in both 0.5
    assert rewards == [1.0, 0.0, 0.5]
    assert len(server.requests) == 6  # each pair judged as (a, b) and (b, a)


def test_an_endpoint_that_keeps_failing_is_a_reward_error_naming_it():
    with StubServer(lambda path, payload, i: (503, {"error": "overloaded"})) as server:
        rs = RewardSet(
            ["openai_judge"],
            reward_kwargs={
                "openai_judge": {
                    "url": server.url(""),
                    "model": "m",
                    "criteria": ["Correct"],
                    "retries": 1,
                    "backoff_s": 0.01,
                }
            },
        )
        with pytest.raises(RewardError, match=r"/v1/chat/completions failed 2 times.*HTTP 503") as err:
            rs.compute(["q", "q"], ["a", "b"])
    assert err.value.skippable and len(server.requests) == 4  # 2 samples x 2 tries, no per-sample re-run


def test_a_reply_that_is_not_a_chat_completion_is_an_error():
    with StubServer(lambda path, payload, i: (200, {"text": "hi"})) as server:
        fn = make_reward("openai_judge", url=server.url("/v1/chat/completions"), model="m", criteria=["C"])
        with pytest.raises(RuntimeError, match="not a chat completion"):
            fn(["q"], ["a"])
    assert server.requests[0][0] == "/v1/chat/completions"  # a full endpoint URL is used as is


def test_bad_kind_is_refused():
    with pytest.raises(ValueError, match="kind must be one of"):
        make_reward("openai_judge", url="http://127.0.0.1:9", model="m", kind="score")
