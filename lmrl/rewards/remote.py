"""Rewards that live elsewhere: an HTTP reward server, and an LLM judge on an OpenAI-compatible chat endpoint.

**Reward server** (`rewards=[http://host:port/path]`): each batch is one JSON POST to the URL

    request:  {"prompts": [...], "completions": [...], "<column>": [...], ...}   # N each
    reply:    {"rewards": [r_0, ..., r_{N-1}]}                                    # N finite numbers

with every dataset column whose values are JSON-serialisable (others, e.g. tensors, are left out). A
connection error, a timeout, HTTP 5xx or 429 is retried `retries` times after `backoff_s`·2^k seconds;
a reply of the wrong length, non-numbers or NaN/inf, or a 4xx, is not retried. Whatever still fails is
raised, so `RewardSet` counts it and skips the step or stops as `on_reward_error` says; every message
names the URL. Options (`reward_kwargs.<name>`, the name is the URL's last path segment: `score` for
`http://127.0.0.1:8000/score`): `timeout_s` (each whole attempt: connect, headers and body), `retries`,
`backoff_s`, `batch_size` (0: one request per batch), `api_key_env` (a variable holding a bearer token),
`headers`, `max_reply_bytes` (16 MiB). A redirect to another host is followed without the token and headers.

**OpenAI judge** (`rewards=[openai_judge]`): the `judge`/`rubric` judges of `lmrl.rewards.judge` with their
prompts and parsing, but each judgement is a POST to `<url>/v1/chat/completions` at temperature 0.
"""

from __future__ import annotations

import http.client
import json
import math
import numbers
import os
import re
import socket
import threading
import time
import urllib.parse
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from lmrl.rewards.types import RewardFn

URL_PREFIXES = ("http://", "https://")
RETRY_STATUS = frozenset({408, 429, 500, 502, 503, 504})


class RemoteError(RuntimeError):
    """A reward server or judge endpoint failed (after its retries) or replied with something unusable."""


def is_url(spec: Any) -> bool:
    return isinstance(spec, str) and spec.startswith(URL_PREFIXES)


def url_name(url: str) -> str:
    """Metric name of a URL reward: its last path segment, else its host (non-word characters -> `_`)."""
    parts = urllib.parse.urlsplit(url)
    segments = [s for s in parts.path.split("/") if s]
    raw = segments[-1] if segments else (parts.hostname or "http")
    return re.sub(r"\W", "_", raw)


MAX_REDIRECTS = 5
REDIRECTS = frozenset({301, 302, 303, 307, 308})
MAX_REPLY_BYTES = 16 << 20
"""the largest reply read (16 MiB: a batch's rewards or a judgement is a few KiB); a larger one is an error"""
_CHUNK = 1 << 16


def post_json(
    url: str,
    payload: Any,
    *,
    timeout_s: float,
    retries: int,
    backoff_s: float,
    headers: Mapping[str, str] | None = None,
    max_reply_bytes: int = MAX_REPLY_BYTES,
) -> Any:
    """POST `payload` as JSON and return the decoded reply; transient failures are retried with backoff.

    `timeout_s` bounds each whole attempt (connect, headers, body), not each read: a server that drips its
    reply is cut at the deadline (issue 46). A reply over `max_reply_bytes` is an error, not read further. A
    redirect is followed (re-POSTed, at most MAX_REDIRECTS) and one to another host (scheme, host or port) is
    sent without `Authorization` and without the caller's headers. Every error is a `RemoteError` naming `url`."""
    data = json.dumps(payload).encode()
    head = {"Content-Type": "application/json", **dict(headers or {})}
    cause = "no attempt"
    for attempt in range(retries + 1):
        try:
            status, reason, body, where = _post_once(url, data, head, timeout_s, max_reply_bytes)
        except RemoteError:
            raise
        except TimeoutError:
            cause = f"timed out after {timeout_s:g}s (timeout_s bounds the whole reply)"
        except (OSError, http.client.HTTPException, ValueError) as err:
            cause = f"{type(err).__name__}: {getattr(err, 'reason', err)}"
        else:
            if status in REDIRECTS:
                raise RemoteError(f"{url} redirected more than {MAX_REDIRECTS} times (last: {where})")
            if status >= 400:
                detail = body[:200].decode(errors="replace")
                cause = f"HTTP {status} {reason}: {detail}" + (f" (from {where})" if where != url else "")
                if status not in RETRY_STATUS:
                    raise RemoteError(f"{url} answered {cause} (not retried: fix the request or the server)")
            else:
                try:
                    return json.loads(body)
                except (ValueError, RecursionError) as err:  # bad UTF-8 too; nesting deeper than Python's stack
                    raise RemoteError(
                        f"{url} replied with invalid JSON ({type(err).__name__}: {str(err)[:120]}): {body[:200]!r}"
                    ) from None
        if attempt < retries:
            time.sleep(backoff_s * 2**attempt)
    raise RemoteError(f"{url} failed {retries + 1} times (retries={retries}); last: {cause}")


def _origin(parts: urllib.parse.SplitResult) -> tuple:
    return parts.scheme, parts.hostname, parts.port or (443 if parts.scheme == "https" else 80)


def _post_once(
    url: str, data: bytes, head: dict[str, str], timeout_s: float, max_reply_bytes: int
) -> tuple[int, str, bytes, str]:
    """One attempt, redirects included, within `timeout_s` from now: (status, reason, body, final URL)."""
    deadline = time.monotonic() + timeout_s
    first = urllib.parse.urlsplit(url)
    where, headers = url, dict(head)
    for _ in range(MAX_REDIRECTS + 1):
        parts = urllib.parse.urlsplit(where)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise RemoteError(f"{url}: cannot POST to {where!r} (an http:// or https:// URL is needed)")
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError
        cls = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
        conn = cls(parts.hostname, parts.port, timeout=left)
        watchdog = threading.Timer(left, _cut, [conn])  # a slow handshake or header drip ends at the deadline too
        watchdog.daemon = True
        watchdog.start()
        try:
            conn.request("POST", urllib.parse.urlunsplit(("", "", parts.path or "/", parts.query, "")), data, headers)
            response = conn.getresponse()
            location = response.getheader("Location")
            if response.status in REDIRECTS and location:
                where = urllib.parse.urljoin(where, location)
                if _origin(urllib.parse.urlsplit(where)) != _origin(first):  # never credentials to another host
                    headers = {"Content-Type": "application/json"}
                continue
            body = _read(response, conn, deadline, max_reply_bytes, url)
            return response.status, response.reason, body, where
        except (OSError, http.client.HTTPException) as err:
            if time.monotonic() >= deadline - 0.01:  # cut by the watchdog or the last read's timeout
                raise TimeoutError from err
            raise
        finally:
            watchdog.cancel()
            conn.close()
    return 308, "redirect", b"", where


def _cut(conn: http.client.HTTPConnection) -> None:
    sock = conn.sock
    if sock is not None:
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


def _read(response, conn, deadline: float, max_reply_bytes: int, url: str) -> bytes:
    """The body, one socket read at a time, until the deadline; more than `max_reply_bytes` is an error."""
    declared = response.getheader("Content-Length")
    if declared and declared.isdigit() and int(declared) > max_reply_bytes:
        raise RemoteError(
            f"{url} announced a reply of {int(declared):,} bytes, over max_reply_bytes={max_reply_bytes:,} (not read)"
        )
    chunks, size = [], 0
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError
        if conn.sock is not None:
            conn.sock.settimeout(left)
        chunk = response.read1(_CHUNK)
        if not chunk:
            if time.monotonic() >= deadline:  # cut by the watchdog
                raise TimeoutError
            body = b"".join(chunks)
            if declared and declared.isdigit() and len(body) < int(declared):  # the server closed mid-reply
                raise http.client.IncompleteRead(body, int(declared) - len(body))
            return body
        size += len(chunk)
        if size > max_reply_bytes:
            raise RemoteError(
                f"{url} replied with more than max_reply_bytes={max_reply_bytes:,} bytes (not read further)"
            )
        chunks.append(chunk)


def auth_headers(api_key_env: str | None, headers: Mapping[str, str] | None = None) -> dict[str, str]:
    out = dict(headers or {})
    if api_key_env:
        key = os.environ.get(api_key_env)
        if not key:
            raise ValueError(
                f"api_key_env={api_key_env!r}: that environment variable is not set; export it or remove api_key_env."
            )
        out["Authorization"] = f"Bearer {key}"
    return out


def _check_options(where: str, timeout_s: float, retries: int, backoff_s: float, batch_size: int) -> None:
    if not timeout_s > 0 or retries < 0 or backoff_s < 0 or batch_size < 0:
        raise ValueError(
            f"{where}: need timeout_s > 0, retries >= 0, backoff_s >= 0 and batch_size >= 0, got "
            f"{timeout_s}, {retries}, {backoff_s}, {batch_size}."
        )


def _json_columns(columns: Mapping[str, Any]) -> dict[str, list]:
    out = {}
    for key, values in columns.items():
        values = values.tolist() if hasattr(values, "tolist") else list(values)
        try:
            json.dumps(values)
        except (TypeError, ValueError):
            continue  # e.g. tensors or objects: the server never sees them
        out[key] = values
    return out


def parse_rewards(url: str, reply: Any, n: int) -> list[float]:
    """The `rewards` of a server reply, checked: n finite numbers, else a RemoteError naming the URL."""
    rewards = reply.get("rewards") if isinstance(reply, Mapping) else None
    if not isinstance(rewards, list):
        raise RemoteError(f'{url} replied {str(reply)[:200]}, not {{"rewards": [float, ...]}}')
    if len(rewards) != n:
        raise RemoteError(f"{url} returned {len(rewards)} rewards for {n} completions; reply one per completion")
    bad = [i for i, r in enumerate(rewards) if isinstance(r, bool) or not isinstance(r, numbers.Real) or not _finite(r)]
    if bad:
        raise RemoteError(
            f"{url} returned {_short(rewards[bad[0]])} at index {bad[0]} ({len(bad)} of {n} rewards are not finite "
            "numbers)"
        )
    return [float(r) for r in rewards]


def _short(value: Any) -> str:
    text = (
        repr(value) if not isinstance(value, int) or abs(value) < 10**100 else f"an integer of {len(str(value))} digits"
    )
    return text if len(text) <= 100 else text[:100] + "..."


def _finite(r: numbers.Real) -> bool:
    try:
        return math.isfinite(float(r))
    except OverflowError:  # an integer beyond float's range
        return False


def http_reward(
    url: str,
    timeout_s: float = 30.0,
    retries: int = 2,
    backoff_s: float = 0.5,
    batch_size: int = 0,
    api_key_env: str | None = None,
    headers: Mapping[str, str] | None = None,
    max_reply_bytes: int = MAX_REPLY_BYTES,
) -> RewardFn:
    """A reward function that POSTs each batch (or `batch_size` rows at a time) to the reward server `url`."""
    if not isinstance(max_reply_bytes, int) or max_reply_bytes < 1:
        raise ValueError(f"reward {url}: max_reply_bytes must be a positive integer, got {max_reply_bytes!r}.")
    _check_options(f"reward {url}", timeout_s, retries, backoff_s, batch_size)
    head = auth_headers(api_key_env, headers)

    def remote(prompts: Sequence[Any], completions: Sequence[str], **columns: Any) -> list[float]:
        n = len(completions)
        sent = _json_columns(columns)
        step = batch_size or max(n, 1)
        out: list[float] = []
        for start in range(0, n, step):
            part = slice(start, start + step)
            payload = {
                "prompts": list(prompts[part]),
                "completions": list(completions[part]),
                **{k: v[part] for k, v in sent.items()},
            }
            reply = post_json(
                url,
                payload,
                timeout_s=timeout_s,
                retries=retries,
                backoff_s=backoff_s,
                headers=head,
                max_reply_bytes=max_reply_bytes,
            )
            out += parse_rewards(url, reply, len(payload["completions"]))
        return out

    remote.__name__ = url_name(url)
    remote.batch_only = True  # RewardSet does not re-send one sample at a time to locate a failure
    return remote


def chat_generator(
    url: str,
    model: str,
    *,
    api_key_env: str | None = None,
    max_tokens: int = 256,
    timeout_s: float = 60.0,
    retries: int = 2,
    backoff_s: float = 0.5,
    concurrency: int = 8,
):
    """`generate(texts) -> replies`: one greedy chat completion per text from an OpenAI-compatible server."""
    _check_options(f"chat endpoint {url}", timeout_s, retries, backoff_s, 0)
    endpoint = url.rstrip("/") + ("" if url.rstrip("/").endswith("/chat/completions") else "/v1/chat/completions")
    head = auth_headers(api_key_env)

    def one(text: str) -> str:
        payload = {
            "model": model,
            "messages": [{"role": "user", "content": text}],
            "temperature": 0,
            "max_tokens": max_tokens,
        }
        reply = post_json(endpoint, payload, timeout_s=timeout_s, retries=retries, backoff_s=backoff_s, headers=head)
        try:
            return str(reply["choices"][0]["message"]["content"] or "")
        except (KeyError, IndexError, TypeError):
            raise RemoteError(f"{endpoint} replied {str(reply)[:200]}, not a chat completion") from None

    def generate(texts: Sequence[str]) -> list[str]:
        with ThreadPoolExecutor(max_workers=max(1, min(concurrency, len(texts)))) as pool:
            return list(pool.map(one, texts))

    generate.endpoint = endpoint
    return generate
