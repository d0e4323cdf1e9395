"""Payload schema: round trip, exact wire format, and every hostile kind rejected with its reason."""

import random

import msgpack
import pytest

from lmrl.swarm.payload import (
    DEFAULT_LIMITS,
    REASONS,
    SCHEMA_VERSION,
    Payload,
    PayloadError,
    PayloadLimits,
    QuestionGroup,
    decode,
    encode,
)


def make_payload(**overrides):
    groups = (
        QuestionGroup("12+30=", "42", "arithmetic", {"expression": "12+30"}, ["42", "41", "<answer>42</answer>"]),
        QuestionGroup(
            "sort 3 1 2 ✓", "1 2 3", "sorting", {"numbers": [3, 1, 2], "descending": False, "w": 0.5}, ["1 2 3"]
        ),
    )
    fields = dict(peer_id="node-0", model_name="builtin:tiny", round=7, groups=groups)
    fields.update(overrides)
    return Payload(**fields)


def wire(payload_dict):
    """Raw msgpack of a hand-built dict: what a (possibly hostile) peer can send."""
    return msgpack.packb(payload_dict, use_bin_type=True)


def valid_dict():
    return {
        "v": SCHEMA_VERSION,
        "peer_id": "node-1",
        "model_name": "m",
        "round": 3,
        "groups": [{"question": "q", "answer": "a", "task": "t", "meta": {}, "completions": ["c1", "c2"]}],
    }


def reason_of(data, limits=DEFAULT_LIMITS):
    with pytest.raises(PayloadError) as info:
        decode(data, limits)
    return info.value.reason


# ---- round trip and format -----------------------------------------------------------------------


def test_round_trip_keeps_every_field_including_unicode_and_ragged_groups():
    payload = make_payload()
    back = decode(encode(payload))
    assert back == payload
    assert [len(g.completions) for g in back.groups] == [3, 1]  # ragged group sizes are allowed
    assert back.groups[1].question.endswith("✓")


def test_wire_format_is_the_documented_msgpack_map():
    payload = Payload("p", "m", 2, [QuestionGroup("q", "a", "t", {"k": (1, 2)}, ["x"])])
    assert msgpack.unpackb(encode(payload)) == {
        "v": 1,
        "peer_id": "p",
        "model_name": "m",
        "round": 2,
        "groups": [{"question": "q", "answer": "a", "task": "t", "meta": {"k": [1, 2]}, "completions": ["x"]}],
    }


def test_lists_become_tuples_so_payloads_are_immutable_and_comparable():
    payload = Payload("p", "m", 0, [QuestionGroup("q", "a", "t", {}, ["x", "y"])])
    assert isinstance(payload.groups, tuple) and isinstance(payload.groups[0].completions, tuple)


def test_decode_accepts_a_hand_built_valid_payload():
    payload = decode(wire(valid_dict()))
    assert payload.peer_id == "node-1" and payload.round == 3
    assert payload.groups[0].completions == ("c1", "c2")


def test_encode_refuses_what_peers_would_reject():
    with pytest.raises(PayloadError) as info:
        encode(make_payload(groups=()))
    assert info.value.reason == "group_count"
    with pytest.raises(PayloadError) as info:
        encode(make_payload(round=-1))
    assert info.value.reason == "bad_round"
    with pytest.raises(PayloadError) as info:
        encode(make_payload(peer_id="\udc80"))  # a lone surrogate has no UTF-8 form
    assert info.value.reason == "bad_utf8"


def test_encode_checks_the_encoded_size():
    # 2 groups x 1000-char completions: well over 1000 bytes once encoded.
    big = QuestionGroup("q", "a", "t", {}, ["x" * 1000])
    with pytest.raises(PayloadError) as info:
        encode(make_payload(groups=(big, big)), PayloadLimits(max_bytes=1000))
    assert info.value.reason == "too_large"


# ---- hostile payloads ------------------------------------------------------------------------------


def test_oversized_data_is_rejected_before_parsing():
    # 1001 bytes of 0xc1 (never valid msgpack): the size check must fire first, not a parse error.
    assert reason_of(b"\xc1" * 1001, PayloadLimits(max_bytes=1000)) == "too_large"


@pytest.mark.parametrize(
    "path, value, reason",
    [
        (("round",), "3", "bad_type"),
        (("round",), True, "bad_type"),  # bool is an int in Python, not a round
        (("round",), 3.0, "bad_type"),
        (("peer_id",), 5, "bad_type"),
        (("peer_id",), b"node-1", "bad_type"),  # msgpack bin, not str
        (("v",), "1", "bad_type"),
        (("groups",), {"0": 1}, "bad_type"),
        (("groups", 0), ["q", "a"], "bad_type"),
        (("groups", 0, "question"), 12, "bad_type"),
        (("groups", 0, "completions"), "c1", "bad_type"),
        (("groups", 0, "completions"), ["ok", None], "bad_type"),
        (("groups", 0, "meta"), [1], "bad_type"),
        (("groups", 0, "meta"), {"x": b"\x00"}, "bad_type"),
    ],
)
def test_wrong_types_are_rejected(path, value, reason):
    obj = valid_dict()
    target = obj
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    assert reason_of(wire(obj)) == reason


def test_invalid_utf8_is_rejected():
    obj = valid_dict()
    obj["groups"][0]["question"] = "QQQQ"
    data = wire(obj)
    assert data.count(b"\xa4QQQQ") == 1  # fixstr of length 4
    assert reason_of(data.replace(b"\xa4QQQQ", b"\xa4\xff\xfeQQ")) == "bad_utf8"
    # UTF-8-encoded surrogate U+D800 (ED A0 80) is invalid UTF-8 too.
    assert reason_of(data.replace(b"\xa4QQQQ", b"\xa4\xed\xa0\x80Q")) == "bad_utf8"


def test_group_sizes_and_counts_are_bounded():
    limits = PayloadLimits(max_group_size=8, max_groups=3)
    obj = valid_dict()
    obj["groups"][0]["completions"] = ["c"] * 9
    assert reason_of(wire(obj), limits) == "group_size"
    obj["groups"][0]["completions"] = []
    assert reason_of(wire(obj), limits) == "group_size"
    obj = valid_dict()
    obj["groups"] = obj["groups"] * 4
    assert reason_of(wire(obj), limits) == "group_count"
    obj["groups"] = []
    assert reason_of(wire(obj), limits) == "group_count"


def test_huge_group_of_a_million_completions_is_rejected_while_parsing():
    obj = valid_dict()
    obj["groups"][0]["completions"] = [""] * 1_000_000  # 1 byte each: ~1 MB, just under max_bytes
    data = wire(obj)
    assert len(data) <= DEFAULT_LIMITS.max_bytes
    # msgpack refuses the array header itself: no list can be longer than max(64, 64, 256) = 256 items.
    assert reason_of(data) == "too_many_items"


def test_a_flood_of_empty_maps_is_stopped_while_parsing():
    # 1 MiB of nested lists of 1-byte `{}`: ~1M dicts if fully built. A valid payload holds at most
    # 2 + 64 * (3 + 256) = 16,578 maps and lists, so parsing stops there.
    inner = b"\xdc\x01\x00" + b"\x80" * 256  # array16 of 256 empty maps
    data = (b"\x81\xa6groups\xdc\x01\x00" + (b"\xdc\x01\x00" + inner * 256) * 16)[: DEFAULT_LIMITS.max_bytes]
    assert reason_of(data) == "too_many_items"


@pytest.mark.parametrize("round_, reason", [(-1, "bad_round"), (10**9 + 1, "bad_round"), (2**63, "bad_round")])
def test_negative_or_absurd_rounds_are_rejected(round_, reason):
    obj = valid_dict()
    obj["round"] = round_
    assert reason_of(wire(obj)) == reason


def test_round_limit_is_inclusive():
    obj = valid_dict()
    obj["round"] = 10**9
    assert decode(wire(obj)).round == 10**9


def test_unknown_and_missing_fields_are_rejected():
    obj = valid_dict()
    obj["__type__"] = "Payload"  # genrl 0.3 style tag: not part of this schema
    assert reason_of(wire(obj)) == "unknown_field"
    obj = valid_dict()
    obj["groups"][0]["reward"] = 1.0  # rewards are recomputed locally, never trusted from peers
    assert reason_of(wire(obj)) == "unknown_field"
    obj = valid_dict()
    del obj["groups"][0]["answer"]
    assert reason_of(wire(obj)) == "missing_field"
    obj = valid_dict()
    obj["v"] = 2
    assert reason_of(wire(obj)) == "bad_version"


def test_non_string_map_keys_are_rejected():
    # {1: 2} as the whole payload: msgpack's strict_map_key refuses int keys.
    assert reason_of(msgpack.packb({1: 2})) == "bad_msgpack"
    obj = valid_dict()
    obj["groups"][0]["meta"] = {b"k": 1}  # bin key
    assert reason_of(wire(obj)) == "bad_type"


def test_truncated_msgpack_is_rejected_at_every_cut():
    data = encode(make_payload())
    reasons = {reason_of(data[:cut]) for cut in range(len(data))}
    # Cutting inside a UTF-8 multibyte character cannot happen (str lengths are byte counts), so every
    # prefix is an incomplete object, except the empty one, which msgpack also reports as incomplete.
    assert reasons == {"truncated"}


def test_garbage_and_trailing_bytes_are_rejected():
    assert reason_of(b"\xc1") == "bad_msgpack"  # 0xc1 is "never used" in msgpack
    assert reason_of(encode(make_payload()) + b"\x00") == "bad_msgpack"
    assert reason_of(b"") == "truncated"
    assert reason_of(msgpack.packb([1, 2])) == "bad_type"
    assert reason_of(msgpack.packb(None)) == "bad_type"


def test_msgpack_ext_types_are_rejected():
    assert reason_of(msgpack.packb(msgpack.ExtType(5, b"x"))) == "ext_type"
    obj = valid_dict()
    obj["groups"][0]["meta"] = {"when": msgpack.Timestamp(1, 0)}  # ext type -1
    assert reason_of(wire(obj)) == "ext_type"
    obj = valid_dict()
    obj["groups"][0]["completions"] = [msgpack.ExtType(1, b"pickle?")]
    assert reason_of(wire(obj)) == "ext_type"


def test_deep_nesting_is_rejected():
    limits = PayloadLimits(max_meta_depth=3)
    obj = valid_dict()
    obj["groups"][0]["meta"] = {"a": {"b": [1]}}  # depth 3: the limit, accepted
    assert decode(wire(obj), limits).groups[0].meta == {"a": {"b": [1]}}
    obj["groups"][0]["meta"] = {"a": {"b": [[1]]}}  # depth 4
    assert reason_of(wire(obj), limits) == "too_deep"
    # 100,000 nested arrays: deeper than msgpack's own parser stack.
    assert reason_of(b"\x91" * 100_000 + b"\x00") == "too_deep"


def test_meta_numbers_must_be_json_safe():
    for bad in (float("nan"), float("inf"), 2**53 + 1, -(2**53) - 1):
        obj = valid_dict()
        obj["groups"][0]["meta"] = {"x": bad}
        assert reason_of(wire(obj)) == "bad_number", bad
    obj = valid_dict()
    obj["groups"][0]["meta"] = {"x": 2**53, "y": -(2**53), "z": 1e308, "n": None, "b": True}
    assert decode(wire(obj)).groups[0].meta["x"] == 2**53


def test_meta_item_count_is_bounded():
    limits = PayloadLimits(max_meta_items=5)
    obj = valid_dict()
    obj["groups"][0]["meta"] = {"a": [1, 2, 3], "b": 4}  # a, 1, 2, 3, b = 5 items: accepted
    assert decode(wire(obj), limits).groups[0].meta == {"a": [1, 2, 3], "b": 4}
    obj["groups"][0]["meta"] = {"a": [1, 2, 3], "b": 4, "c": 5}  # 6 items
    assert reason_of(wire(obj), limits) == "too_many_items"


@pytest.mark.parametrize(
    "field, limit_name",
    [("question", "max_question_chars"), ("answer", "max_answer_chars"), ("task", "max_task_chars")],
)
def test_string_lengths_are_bounded_in_characters(field, limit_name):
    limits = PayloadLimits(**{limit_name: 4})
    obj = valid_dict()
    obj["groups"][0][field] = "ééé✓"  # 4 characters, 8 UTF-8 bytes: within a 4-character limit
    assert getattr(decode(wire(obj), limits).groups[0], field) == "ééé✓"
    obj["groups"][0][field] = "ééé✓x"
    assert reason_of(wire(obj), limits) == "string_too_long"


def test_completion_peer_model_and_meta_strings_are_bounded():
    obj = valid_dict()
    obj["groups"][0]["completions"] = ["x" * 11]
    assert reason_of(wire(obj), PayloadLimits(max_completion_chars=10)) == "string_too_long"
    obj = valid_dict()
    obj["peer_id"] = "p" * 129
    assert reason_of(wire(obj)) == "string_too_long"
    obj = valid_dict()
    obj["model_name"] = ""
    assert reason_of(wire(obj)) == "empty_string"
    obj = valid_dict()
    obj["groups"][0]["meta"] = {"k" * 11: 1}
    assert reason_of(wire(obj), PayloadLimits(max_meta_str_chars=10)) == "string_too_long"


def test_random_corruptions_only_ever_raise_payload_error():
    """Fuzz: 3000 byte-level mutations of a valid payload decode or raise PayloadError, nothing else."""
    data = encode(make_payload())
    rng = random.Random(0)
    seen = set()
    for _ in range(3000):
        buf = bytearray(data)
        for _ in range(rng.randint(1, 4)):
            kind = rng.random()
            pos = rng.randrange(len(buf))
            if kind < 0.6:
                buf[pos] = rng.randrange(256)
            elif kind < 0.8:
                del buf[pos : pos + rng.randint(1, 8)]
            else:
                buf[pos:pos] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 8)))
        try:
            decode(bytes(buf))
        except PayloadError as err:
            seen.add(err.reason)
    assert seen <= set(REASONS)
    assert {"bad_msgpack", "truncated", "bad_type"} <= seen  # the fuzz does reach the checks


def test_limits_and_reasons_are_validated():
    with pytest.raises(ValueError, match="max_groups"):
        PayloadLimits(max_groups=0)
    with pytest.raises(ValueError, match="max_bytes"):
        PayloadLimits(max_bytes=True)
    with pytest.raises(ValueError, match="reason"):
        PayloadError("not_a_reason", "x")
    with pytest.raises(PayloadError) as info:
        decode("not bytes")
    assert info.value.reason == "bad_type"
