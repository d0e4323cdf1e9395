"""The HTTP reward server reward (`rewards=[http://host:port/path]`), against a local stub server."""

import pytest
import torch

from lmrl.rewards import RewardError, RewardSet, load_reward, reward_name
from tests.rewards.stub_server import StubServer, slow

PROMPTS = ["p0", "p1", "p2"]
COMPLETIONS = ["a", "bb", "ccc"]
FAST = {"backoff_s": 0.01}


def lengths(path, payload, i):
    return 200, {"rewards": [len(c) for c in payload["completions"]]}


def test_batch_is_one_post_with_the_json_columns_and_rewards_come_back_in_order():
    with StubServer(lengths) as server:
        rs = RewardSet([server.url("/score")], reward_kwargs={"score": FAST})
        total, components, _ = rs.compute(
            PROMPTS,
            COMPLETIONS,
            answer=["1", "2", "3"],
            truncated=[False, True, False],
            blob=[object(), object(), object()],
        )
    assert rs.names == ["score"]
    torch.testing.assert_close(total, torch.tensor([1.0, 2.0, 3.0]), rtol=0, atol=0)
    assert len(server.requests) == 1
    path, payload, _ = server.requests[0]
    assert path == "/score"
    # the non-JSON column `blob` is left out; the others are sent as lists aligned with the completions
    assert payload == {
        "prompts": PROMPTS,
        "completions": COMPLETIONS,
        "answer": ["1", "2", "3"],
        "truncated": [False, True, False],
    }


def test_batch_size_splits_the_batch_into_several_posts():
    with StubServer(lengths) as server:
        fn = load_reward(server.url(), batch_size=2, **FAST)
        assert fn(PROMPTS, COMPLETIONS, answer=["x", "y", "z"]) == [1.0, 2.0, 3.0]
    assert [p["completions"] for _, p, _ in server.requests] == [["a", "bb"], ["ccc"]]
    assert server.requests[1][1]["answer"] == ["z"]


def test_a_server_that_fails_once_then_succeeds_is_retried():
    def flaky(path, payload, i):
        return (503, {"error": "warming up"}) if i == 0 else lengths(path, payload, i)

    with StubServer(flaky) as server:
        rs = RewardSet([server.url()], reward_kwargs={server.url(): {"retries": 1, **FAST}})
        total, _, metrics = rs.compute(PROMPTS, COMPLETIONS)
    assert total.tolist() == [1.0, 2.0, 3.0] and len(server.requests) == 2
    assert metrics["reward/errors"] == 0.0


def test_a_server_that_always_fails_is_a_skippable_error_naming_the_url():
    with StubServer(lambda path, payload, i: (500, {"error": "down"})) as server:
        rs = RewardSet([server.url()], reward_kwargs={"score": {"retries": 2, **FAST}}, max_skipped_steps=2)
        with pytest.raises(RewardError) as err:
            rs.compute(PROMPTS, COMPLETIONS)
        # 1 try + 2 retries, and no re-sending of single samples to locate the failure
        assert len(server.requests) == 3
        assert err.value.skippable and rs.errors == 1
        assert server.url() in str(err.value) and "HTTP 500" in str(err.value) and "3 times" in str(err.value)
        with pytest.raises(RewardError) as err:  # the second failure in a row reaches max_skipped_steps=2
            rs.compute(PROMPTS, COMPLETIONS)
        assert not err.value.skippable and rs.errors == 2


def test_a_client_error_is_not_retried():
    with StubServer(lambda path, payload, i: (400, {"error": "bad field"})) as server:
        fn = load_reward(server.url(), retries=3, **FAST)
        with pytest.raises(RuntimeError, match="HTTP 400.*bad field.*not retried"):
            fn(PROMPTS, COMPLETIONS)
    assert len(server.requests) == 1


@pytest.mark.parametrize(
    ("body", "match"),
    [
        ({"rewards": [1.0]}, "returned 1 rewards for 3 completions"),
        (b'{"rewards": [1.0, NaN, 2.0]}', "returned nan at index 1"),
        ({"rewards": [1.0, "x", 2.0]}, "returned 'x' at index 1"),
        ({"score": 1.0}, 'not {"rewards"'),
    ],
)
def test_a_wrong_reply_is_a_clear_error_naming_the_url(body, match):
    with StubServer(lambda path, payload, i: (200, body)) as server:
        rs = RewardSet([server.url()], reward_kwargs={"score": FAST})
        with pytest.raises(RewardError, match=match) as err:
            rs.compute(PROMPTS, COMPLETIONS)
    assert server.url() in str(err.value) and len(server.requests) == 1  # not retried


def test_a_server_slower_than_timeout_s_times_out():
    with StubServer(lambda path, payload, i: slow(1.0, lengths(path, payload, i))) as server:
        fn = load_reward(server.url(), timeout_s=0.2, retries=1, **FAST)
        # without the timeout the server's reply (after 1 s) would come back and nothing would be raised
        with pytest.raises(RuntimeError, match=r"failed 2 times.*timed out after 0.2s"):
            fn(PROMPTS, COMPLETIONS)


def test_api_key_env_sends_a_bearer_token(monkeypatch):
    monkeypatch.setenv("LMRL_TEST_KEY", "s3cret")
    with StubServer(lengths) as server:
        load_reward(server.url(), api_key_env="LMRL_TEST_KEY")(["p"], ["c"])
    assert server.requests[0][2]["Authorization"] == "Bearer s3cret"
    monkeypatch.delenv("LMRL_TEST_KEY")
    with pytest.raises(ValueError, match="LMRL_TEST_KEY"):
        load_reward("http://127.0.0.1:9/score", api_key_env="LMRL_TEST_KEY")


def test_names_and_option_errors():
    assert reward_name("http://127.0.0.1:8000/v1/score") == "score"
    assert reward_name("https://rm.example.org") == "rm_example_org"
    with pytest.raises(ValueError, match=r"timeout.*timeout_s=30.0.*reward_kwargs.score"):
        load_reward("http://127.0.0.1:9/score", timeout=3)
    with pytest.raises(ValueError, match="timeout_s > 0"):
        load_reward("http://127.0.0.1:9/score", timeout_s=0)


# ---- issue 46: a whole-request deadline, a reply size cap, every error naming the URL, no token across hosts


class RawServer:
    """A one-thread HTTP server on 127.0.0.1 whose replies are raw bytes written by `reply(sock, i)`; `requests`
    records each request's header block."""

    def __init__(self, reply):
        import socket
        import threading

        self.reply, self.requests = reply, []
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.thread = threading.Thread(target=self._serve, daemon=True)

    def url(self, path="/score"):
        return f"http://127.0.0.1:{self.port}{path}"

    def _serve(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                data = b""
                while b"\r\n\r\n" not in data:
                    data += conn.recv(65536)
                head, _, body = data.partition(b"\r\n\r\n")
                length = int(
                    next(
                        (h.split(b":")[1] for h in head.split(b"\r\n") if h.lower().startswith(b"content-length")), b"0"
                    )
                )
                while len(body) < length:
                    body += conn.recv(65536)
                self.requests.append(head.decode())
                try:
                    self.reply(conn, len(self.requests) - 1)
                except OSError:  # the client left
                    pass

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.sock.close()


def test_a_server_that_drips_its_reply_is_cut_at_timeout_s():
    import time

    def drip(conn, i):
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 80\r\n\r\n")
        for _ in range(80):  # one byte every 0.1 s: each read is quick, the reply takes 8 s
            conn.sendall(b" ")
            time.sleep(0.1)

    with RawServer(drip) as server:
        fn = load_reward(server.url(), timeout_s=0.5, retries=0)
        start = time.monotonic()
        with pytest.raises(RuntimeError, match=r"timed out after 0.5s") as err:
            fn(PROMPTS, COMPLETIONS)
        assert time.monotonic() - start < 2.0 and server.url() in str(err.value)


@pytest.mark.parametrize("announced", [True, False])
def test_a_reply_over_max_reply_bytes_is_an_error_not_memory(announced):
    size = 4 << 20

    def flood(conn, i):
        length = f"Content-Length: {size}\r\n" if announced else "Connection: close\r\n"
        conn.sendall(f"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n{length}\r\n".encode())
        for _ in range(size >> 16):
            conn.sendall(b"[" * (1 << 16))

    with RawServer(flood) as server:
        fn = load_reward(server.url(), max_reply_bytes=1 << 20, retries=2, backoff_s=0.01)
        with pytest.raises(RuntimeError, match="max_reply_bytes") as err:
            fn(PROMPTS, COMPLETIONS)
    assert server.url() in str(err.value) and len(server.requests) == 1  # not retried


@pytest.mark.parametrize(
    ("body", "match"),
    [
        (b"[" * 100_000 + b"]" * 100_000, "invalid JSON"),  # deeper than Python's stack
        (b'{"rewards": "\xff\xfe"}', "invalid JSON"),  # not UTF-8
        (b'{"rewards": [1, 1' + b"0" * 400 + b", 2]}", "integer of 401 digits at index 1"),  # beyond float
    ],
)
def test_every_bad_reply_names_the_url(body, match):
    with StubServer(lambda path, payload, i: (200, body)) as server:
        fn = load_reward(server.url(), retries=0)
        with pytest.raises(RuntimeError, match=match) as err:
            fn(PROMPTS, COMPLETIONS)
    assert server.url() in str(err.value)


def test_a_cut_reply_names_the_url():
    def cut(conn, i):
        conn.sendall(b'HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{"rew')

    with RawServer(cut) as server:
        with pytest.raises(RuntimeError, match="IncompleteRead") as err:
            load_reward(server.url(), retries=0)(PROMPTS, COMPLETIONS)
    assert server.url() in str(err.value)


def test_the_bearer_token_is_not_sent_to_another_host_on_redirect(monkeypatch):
    monkeypatch.setenv("LMRL_TEST_KEY", "s3cret")
    ok = b'{"rewards": [1, 2, 3]}'

    def answer(conn, i):
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(ok), ok))

    with RawServer(answer) as other:

        def redirect(conn, i):
            target = other.url() if i == 0 else "/moved"  # first to another host (port), then within this one
            conn.sendall(f"HTTP/1.1 307 Temporary Redirect\r\nLocation: {target}\r\nContent-Length: 0\r\n\r\n".encode())

        with RawServer(redirect) as first:
            fn = load_reward(first.url(), api_key_env="LMRL_TEST_KEY", headers={"X-Api-Key": "k2"}, retries=0)
            assert fn(PROMPTS, COMPLETIONS) == [1.0, 2.0, 3.0]
            assert "s3cret" in first.requests[0] and "s3cret" not in other.requests[0]
            assert "k2" not in other.requests[0] and other.requests[0].startswith("POST /score")
