"""The SAPO rollout payload: plain data on the wire (msgpack, never pickle), checked on arrival.

One payload is one node's rollouts of one round (SAPO, arXiv 2509.08721, section 2:
C^n(q) = (q, y_q, R^n(q), M^n) shared as decoded text): a list of question groups,
each with the question, its ground-truth answer, the task id and JSON-able task
`meta` (what the receiver's own verifier needs to re-score it) and the node's
completions, plus who sent it (`peer_id`), with what model and for which round.

Wire format (msgpack map, schema version 1; every key required, no other key)::

    {"v": 1, "peer_id": str, "model_name": str, "round": int,
     "groups": [{"question": str, "answer": str, "task": str,
                 "meta": {str: JSON value}, "completions": [str, ...]}, ...]}

`decode` trusts nothing: a peer may send anything at all. It checks the byte size
before parsing, then every type, count, length, number and nesting depth against
`PayloadLimits`, and raises `PayloadError` whose `reason` is one of `REASONS`.
`encode` runs the same checks, so a node never publishes what its peers would reject.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import msgpack

SCHEMA_VERSION = 1

REASONS: dict[str, str] = {
    "too_large": "the encoded payload is larger than `max_bytes`",
    "bad_msgpack": "not one well-formed msgpack object (garbage, trailing bytes, non-string map keys)",
    "truncated": "the msgpack data ends in the middle of an object (a length header promises more than follows)",
    "bad_utf8": "a string is not valid UTF-8 (or holds lone surrogates)",
    "ext_type": "a msgpack extension type (ext, timestamp) where only JSON-like data is allowed",
    "too_deep": "nesting deeper than the schema allows (`max_meta_depth` inside `meta`)",
    "bad_type": "a field has the wrong type (e.g. a number where a string belongs, bytes anywhere)",
    "missing_field": "a required field is absent",
    "unknown_field": "a field the schema does not have",
    "bad_version": "a schema version this code does not read",
    "bad_round": "the round is negative or above `max_round`",
    "bad_number": "a number in `meta` is NaN/inf or an integer beyond +-2**53 (not JSON-safe)",
    "group_count": "no question groups, or more than `max_groups`",
    "group_size": "a group with no completions, or more than `max_group_size`",
    "string_too_long": "a string longer than its limit (limits count characters)",
    "empty_string": "an empty `peer_id`, `model_name` or `task`",
    "too_many_items": "`meta` holds more than `max_meta_items` values in total, or a list/map (or the number "
    "of them) exceeds what any valid payload holds",
}
"""Every `PayloadError.reason`, with what it means. Transports and `fetch_valid` add their own
reasons (see `lmrl.swarm.transport.TRANSPORT_REASONS`)."""

JSON_SAFE_INT = 2**53
"""Integers in `meta` must lie in [-2**53, 2**53]: beyond it JSON readers lose precision."""


class PayloadError(ValueError):
    """A payload that breaks the schema or the limits; `reason` is a key of `REASONS`."""

    def __init__(self, reason: str, detail: str) -> None:
        if reason not in REASONS:
            raise ValueError(f"PayloadError reason '{reason}' is not one of {sorted(REASONS)}.")
        self.reason = reason
        self.detail = detail
        super().__init__(f"{reason}: {detail}")


@dataclasses.dataclass(frozen=True)
class PayloadLimits:
    """What a node accepts from a peer. Defaults fit the SAPO paper's rounds (8 questions x
    8 completions of a few hundred tokens) with wide margins. Parsing a payload of n bytes
    costs O(n) time and a small multiple of n in memory whatever a hostile peer sends."""

    max_bytes: int = 1 << 20
    """Encoded size cap, checked before parsing (1 MiB = 64 groups x 8 completions x 2 KB)."""
    max_groups: int = 64
    """Question groups per payload (the paper shares all of B^n; I+J=8 there)."""
    max_group_size: int = 64
    """Completions per group (L^n; the paper uses 8, rl-swarm 2). Group sizes may differ."""
    max_question_chars: int = 16_384
    max_answer_chars: int = 4_096
    max_completion_chars: int = 32_768
    max_task_chars: int = 128
    max_peer_id_chars: int = 128
    """libp2p peer ids are ~52 characters."""
    max_model_name_chars: int = 256
    max_meta_items: int = 256
    """Values in `meta`, counted recursively (keys, list items and nested dicts each count 1)."""
    max_meta_depth: int = 4
    """Container nesting inside `meta`: `{"a": 1}` is depth 1, `{"a": [1]}` depth 2."""
    max_meta_str_chars: int = 4_096
    """Any string (key or value) inside `meta`."""
    max_round: int = 10**9
    """Rounds are 0-based counters; a billion rounds is far beyond any run."""

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(
                    f"PayloadLimits.{f.name} must be a positive integer, got {value!r}. Every limit "
                    "bounds what a peer can send; pass a positive int or leave the default."
                )


DEFAULT_LIMITS = PayloadLimits()


@dataclasses.dataclass(frozen=True)
class QuestionGroup:
    """One question and a node's L completions of it (a "rollout" R^n(q) in the paper)."""

    question: str
    answer: str
    """The ground truth y_q; receivers re-score completions with their own verifier."""
    task: str
    """Task id for the verifier, e.g. "arithmetic" (`lmrl.data.tasks.get_task`)."""
    meta: dict[str, Any]
    """JSON-able data the verifier needs (the task row's `meta`)."""
    completions: tuple[str, ...]
    """The decoded completion texts; length = this node's group size for the question."""

    def __post_init__(self) -> None:
        # Accept any sequence (lists are natural to build); store a tuple so the group stays immutable.
        if isinstance(self.completions, (list, tuple)):
            object.__setattr__(self, "completions", tuple(self.completions))


@dataclasses.dataclass(frozen=True)
class Payload:
    """One node's rollouts for one round."""

    peer_id: str
    model_name: str
    round: int
    groups: tuple[QuestionGroup, ...]

    def __post_init__(self) -> None:
        if isinstance(self.groups, (list, tuple)):
            object.__setattr__(self, "groups", tuple(self.groups))


_TOP_KEYS = ("v", "peer_id", "model_name", "round", "groups")
_GROUP_KEYS = ("question", "answer", "task", "meta", "completions")


def encode(payload: Payload, limits: PayloadLimits = DEFAULT_LIMITS) -> bytes:
    """The msgpack bytes of `payload`, after checking it against `limits` like a receiver would.

    Raises PayloadError if a peer with the same limits would reject it (so the
    node finds out at publish time, not from silent peers)."""
    if not isinstance(payload, Payload):
        raise TypeError(f"encode() takes a Payload, got {type(payload).__name__}.")
    obj = {
        "v": SCHEMA_VERSION,
        "peer_id": payload.peer_id,
        "model_name": payload.model_name,
        "round": payload.round,
        "groups": [
            {
                "question": g.question,
                "answer": g.answer,
                "task": g.task,
                "meta": _plain(g.meta, depth=1, limits=limits),
                "completions": list(g.completions),
            }
            for g in payload.groups
        ],
    }
    _check_payload(obj, limits)  # the same checks as decode, on the Python objects
    try:
        data = msgpack.packb(obj, use_bin_type=True)
    except UnicodeEncodeError as err:
        raise PayloadError("bad_utf8", f"a string cannot be encoded as UTF-8 ({err.reason})") from err
    if len(data) > limits.max_bytes:
        raise PayloadError(
            "too_large",
            f"the encoded payload is {len(data)} bytes, above max_bytes={limits.max_bytes}; "
            "share fewer groups per round or raise the limit on every node",
        )
    return data


def decode(data: bytes, limits: PayloadLimits = DEFAULT_LIMITS) -> Payload:
    """Parse and validate one peer's payload; raise PayloadError (with `.reason`) on anything wrong."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise PayloadError("bad_type", f"payload data must be bytes, got {type(data).__name__}")
    if len(data) > limits.max_bytes:
        raise PayloadError("too_large", f"{len(data)} bytes > max_bytes={limits.max_bytes}")
    # msgpack builds every object before the schema check, and a 1-byte `{}` becomes a 64-byte dict: cap
    # container lengths and the number of containers while parsing, so a hostile payload costs no more
    # than an honest one of the same size (a 1 MiB flood of `{}` fails after ~16k maps, not 1M).
    budget = [_max_containers(limits)]

    def count(container: Any) -> Any:
        budget[0] -= 1
        if budget[0] < 0:
            raise _TooManyContainers
        return container

    try:
        obj = msgpack.unpackb(
            data,
            raw=False,  # str must be valid UTF-8 (strict decoder: no surrogates)
            strict_map_key=True,  # map keys must be str (or bytes, rejected below)
            max_array_len=max(limits.max_groups, limits.max_group_size, limits.max_meta_items),
            max_map_len=max(len(_TOP_KEYS), len(_GROUP_KEYS), limits.max_meta_items),
            list_hook=count,
            object_hook=count,
        )
    except _TooManyContainers:
        raise PayloadError("too_many_items", "more maps and lists than the schema can hold") from None
    except UnicodeDecodeError as err:
        raise PayloadError("bad_utf8", f"invalid UTF-8 in a string ({err.reason})") from err
    except msgpack.StackError as err:
        raise PayloadError("too_deep", "msgpack nesting exceeds the parser's stack") from err
    except msgpack.ExtraData as err:
        raise PayloadError("bad_msgpack", "trailing bytes after the msgpack object") from err
    except ValueError as err:  # FormatError is a ValueError too
        if "incomplete input" in str(err):
            raise PayloadError("truncated", "the data ends in the middle of a msgpack object") from err
        if "exceeds max_array_len" in str(err) or "exceeds max_map_len" in str(err):
            raise PayloadError("too_many_items", f"a list or map longer than any field allows ({err})") from err
        if "exceeds max_" in str(err):  # str/bin/ext lengths are capped at len(data): more than can follow
            raise PayloadError("truncated", f"a length header promises more than the data holds ({err})") from err
        raise PayloadError("bad_msgpack", f"not valid msgpack ({type(err).__name__}: {err})") from err
    except Exception as err:  # noqa: BLE001 - hostile bytes must never escape as another error type
        raise PayloadError("bad_msgpack", f"not valid msgpack ({type(err).__name__}: {err})") from err
    _check_payload(obj, limits)
    groups = tuple(
        QuestionGroup(g["question"], g["answer"], g["task"], g["meta"], tuple(g["completions"])) for g in obj["groups"]
    )
    return Payload(obj["peer_id"], obj["model_name"], obj["round"], groups)


class _TooManyContainers(Exception):
    """Raised from msgpack's hooks to stop parsing a container flood."""


def _max_containers(limits: PayloadLimits) -> int:
    """Maps and lists a valid payload can hold: the top map and the groups list, then per group its map,
    its completions list, its meta map and at most `max_meta_items` nested containers."""
    return 2 + limits.max_groups * (3 + limits.max_meta_items)


# ---- checks shared by encode and decode -------------------------------------------------------


def _plain(value: Any, depth: int, limits: PayloadLimits) -> Any:
    """`value` with tuples turned into lists (what a receiver will see), for the node's own meta."""
    if depth > limits.max_meta_depth + 1:  # deep enough to fail the check anyway; stop recursing
        raise PayloadError("too_deep", f"meta nests deeper than max_meta_depth={limits.max_meta_depth}")
    if isinstance(value, dict):
        return {k: _plain(v, depth + 1, limits) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v, depth + 1, limits) for v in value]
    return value


def _check_payload(obj: Any, limits: PayloadLimits) -> None:
    _check_map(obj, _TOP_KEYS, "payload")
    version = obj["v"]
    if isinstance(version, bool) or not isinstance(version, int):
        raise PayloadError("bad_type", f"'v' must be an int, got {type(version).__name__}")
    if version != SCHEMA_VERSION:
        raise PayloadError("bad_version", f"schema version {version}, this code reads {SCHEMA_VERSION}")
    _check_str(obj["peer_id"], "peer_id", limits.max_peer_id_chars, nonempty=True)
    _check_str(obj["model_name"], "model_name", limits.max_model_name_chars, nonempty=True)
    rnd = obj["round"]
    if isinstance(rnd, bool) or not isinstance(rnd, int):
        raise PayloadError("bad_type", f"'round' must be an int, got {type(rnd).__name__}")
    if not 0 <= rnd <= limits.max_round:
        raise PayloadError("bad_round", f"round {rnd} is outside [0, {limits.max_round}]")
    groups = obj["groups"]
    if not isinstance(groups, list):
        raise PayloadError("bad_type", f"'groups' must be a list, got {type(groups).__name__}")
    if not 1 <= len(groups) <= limits.max_groups:
        raise PayloadError("group_count", f"{len(groups)} groups, allowed 1..{limits.max_groups}")
    for i, group in enumerate(groups):
        _check_group(group, f"groups[{i}]", limits)


def _check_group(group: Any, where: str, limits: PayloadLimits) -> None:
    _check_map(group, _GROUP_KEYS, where)
    _check_str(group["question"], f"{where}.question", limits.max_question_chars)
    _check_str(group["answer"], f"{where}.answer", limits.max_answer_chars)
    _check_str(group["task"], f"{where}.task", limits.max_task_chars, nonempty=True)
    meta = group["meta"]
    if not isinstance(meta, dict):
        raise PayloadError("bad_type", f"{where}.meta must be a map, got {type(meta).__name__}")
    _check_json(meta, f"{where}.meta", limits, depth=1, count=[0])
    completions = group["completions"]
    if not isinstance(completions, list):
        raise PayloadError("bad_type", f"{where}.completions must be a list, got {type(completions).__name__}")
    if not 1 <= len(completions) <= limits.max_group_size:
        raise PayloadError(
            "group_size", f"{where} has {len(completions)} completions, allowed 1..{limits.max_group_size}"
        )
    for j, completion in enumerate(completions):
        _check_str(completion, f"{where}.completions[{j}]", limits.max_completion_chars)


def _check_map(obj: Any, keys: tuple[str, ...], where: str) -> None:
    if isinstance(obj, (msgpack.ExtType, msgpack.Timestamp)):
        raise PayloadError("ext_type", f"{where} is a msgpack extension type")
    if not isinstance(obj, dict):
        raise PayloadError("bad_type", f"{where} must be a map, got {type(obj).__name__}")
    for key in obj:
        if not isinstance(key, str):
            raise PayloadError("bad_type", f"{where} has a non-string key of type {type(key).__name__}")
        if key not in keys:
            raise PayloadError("unknown_field", f"{where} has the unknown field {key[:64]!r}")
    for key in keys:
        if key not in obj:
            raise PayloadError("missing_field", f"{where} lacks the field '{key}'")


def _check_str(value: Any, where: str, max_chars: int, nonempty: bool = False) -> None:
    if isinstance(value, (msgpack.ExtType, msgpack.Timestamp)):
        raise PayloadError("ext_type", f"{where} is a msgpack extension type")
    if not isinstance(value, str):
        raise PayloadError("bad_type", f"{where} must be a string, got {type(value).__name__}")
    if len(value) > max_chars:
        raise PayloadError("string_too_long", f"{where} has {len(value)} characters, limit {max_chars}")
    if nonempty and not value:
        raise PayloadError("empty_string", f"{where} is empty")


def _check_json(value: Any, where: str, limits: PayloadLimits, depth: int, count: list[int]) -> None:
    """JSON-able: None, bool, JSON-safe int, finite float, str, list, str-keyed dict; bounded
    depth and total item count. `count` is a one-element accumulator over the whole `meta`."""
    if isinstance(value, (dict, list)):
        if depth > limits.max_meta_depth:
            raise PayloadError("too_deep", f"{where} nests deeper than max_meta_depth={limits.max_meta_depth}")
        items = value.items() if isinstance(value, dict) else enumerate(value)
        for key, item in items:
            count[0] += 1
            if count[0] > limits.max_meta_items:
                raise PayloadError("too_many_items", f"{where} holds more than max_meta_items={limits.max_meta_items}")
            if isinstance(value, dict):
                if not isinstance(key, str):
                    raise PayloadError("bad_type", f"{where} has a non-string key of type {type(key).__name__}")
                _check_str(key, f"{where} key", limits.max_meta_str_chars)
            # Recursion depth is bounded by max_meta_depth (checked above before descending).
            _check_json(item, f"{where}[{key!r}]"[:200], limits, depth + 1, count)
    elif value is None or isinstance(value, bool):
        return
    elif isinstance(value, int):
        if not -JSON_SAFE_INT <= value <= JSON_SAFE_INT:
            raise PayloadError("bad_number", f"{where} = {value} is beyond +-2**53")
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise PayloadError("bad_number", f"{where} = {value} is not finite")
    elif isinstance(value, str):
        _check_str(value, where, limits.max_meta_str_chars)
    elif isinstance(value, (msgpack.ExtType, msgpack.Timestamp)):
        raise PayloadError("ext_type", f"{where} is a msgpack extension type")
    else:
        raise PayloadError("bad_type", f"{where} has the non-JSON type {type(value).__name__}")
