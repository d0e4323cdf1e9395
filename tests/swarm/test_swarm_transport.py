"""Memory and file transports, expiry, SkipCounter, and fetch_valid skipping hostile peers."""

import subprocess
import sys
import threading
from pathlib import Path

import msgpack
import pytest

from lmrl.swarm.memory import FileHub, MemoryHub, MemoryTransport
from lmrl.swarm.payload import DEFAULT_LIMITS, Payload, PayloadLimits, QuestionGroup, encode
from lmrl.swarm.transport import OTHER_PEERS, SkipCounter, Transport, fetch_valid

REPO = Path(__file__).resolve().parents[2]


def payload_of(peer, round_, n_groups=1, marker="x"):
    groups = [QuestionGroup(f"q{i}", "4", "arithmetic", {"i": i}, [f"{marker}{i}", "4"]) for i in range(n_groups)]
    return Payload(peer, "builtin:tiny", round_, groups)


# ---- SkipCounter -----------------------------------------------------------------------------------


def test_skip_counter_counts_by_reason_and_peer():
    counter = SkipCounter()
    counter.skip("a", "too_large")
    counter.skip("a", "bad_utf8")
    counter.skip("b", "too_large")
    counter.accept(3)
    assert counter.by_reason == {"too_large": 2, "bad_utf8": 1}
    assert counter.by_peer == {"a": 2, "b": 1}
    assert counter.skipped == 3
    assert counter.metrics() == {
        "swarm/accepted": 3,
        "swarm/skipped": 3,
        "swarm/skipped/bad_utf8": 1,
        "swarm/skipped/too_large": 2,
    }


def test_skip_counter_bounds_the_peers_it_tracks():
    counter = SkipCounter(max_tracked_peers=2)
    for peer in ["a", "b", "c", "d", "a"]:
        counter.skip(peer, "bad_type")
    # a, b tracked; c, d pooled; the second "a" still goes to "a".
    assert counter.by_peer == {"a": 2, "b": 1, OTHER_PEERS: 2}


def test_skip_counter_rejects_unknown_reasons():
    with pytest.raises(ValueError, match="Unknown skip reason"):
        SkipCounter().skip("a", "typo_reason")


# ---- memory transport --------------------------------------------------------------------------------


def test_memory_transport_satisfies_the_protocol():
    assert isinstance(MemoryTransport(MemoryHub(), "n"), Transport)


def test_four_nodes_in_threads_each_see_the_other_three():
    hub = MemoryHub()
    nodes = [MemoryTransport(hub, f"node-{i}") for i in range(4)]
    limits, barrier, results, errors = DEFAULT_LIMITS, threading.Barrier(4), {}, []

    def run(node):
        try:
            for round_ in range(3):
                node.publish(round_, encode(payload_of(node.peer_id, round_, marker=node.peer_id)))
                barrier.wait(timeout=10)  # everyone published this round
                counter = SkipCounter()
                got = fetch_valid(node, round_, limits, counter)
                results[(node.peer_id, round_)] = sorted(p.peer_id for p in got)
                assert counter.skipped == 0 and counter.accepted == 3
                assert all(p.groups[0].completions[0] == f"{p.peer_id}0" for p in got)
                barrier.wait(timeout=10)  # nobody publishes round r+1 before all fetched round r
        except Exception as err:  # surfaced in the main thread below
            errors.append(err)

    threads = [threading.Thread(target=run, args=(node,)) for node in nodes]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert not errors, errors
    for i in range(4):
        for round_ in range(3):
            assert results[(f"node-{i}", round_)] == [f"node-{j}" for j in range(4) if j != i]


def test_fetch_can_include_self_and_returns_peers_in_order():
    hub = MemoryHub()
    a, b = MemoryTransport(hub, "b-node"), MemoryTransport(hub, "a-node")
    a.publish(0, b"1")
    b.publish(0, b"2")
    assert a.fetch(0) == [("a-node", b"2")]
    assert a.fetch(0, exclude_self=False) == [("a-node", b"2"), ("b-node", b"1")]
    assert a.fetch(5) == []


def test_republishing_replaces_the_entry():
    hub = MemoryHub()
    a, b = MemoryTransport(hub, "a"), MemoryTransport(hub, "b")
    a.publish(0, b"old")
    a.publish(0, b"new")
    assert b.fetch(0) == [("a", b"new")]


def test_memory_hub_keeps_the_last_rounds_only():
    hub = MemoryHub(keep_rounds=2)
    a, b = MemoryTransport(hub, "a"), MemoryTransport(hub, "b")
    a.publish(0, b"r0")
    a.publish(1, b"r1")
    assert hub.rounds() == [0, 1]
    a.publish(2, b"r2")  # newest 2, keep 2 -> rounds 1 and 2
    assert hub.rounds() == [1, 2]
    assert b.fetch(0) == []
    b.publish(0, b"late")  # a straggler's round 0 is its own business: stored, and pruned by its own rounds
    assert b.fetch(0, exclude_self=False) == [("b", b"late")]
    assert b.fetch(1) == [("a", b"r1")]


def test_memory_transport_input_errors_are_clear():
    hub = MemoryHub()
    with pytest.raises(ValueError, match="peer_id"):
        MemoryTransport(hub, "")
    node = MemoryTransport(hub, "a")
    with pytest.raises(ValueError, match="round"):
        node.publish(-1, b"x")
    with pytest.raises(TypeError, match="encode"):
        node.publish(0, payload_of("a", 0))
    with pytest.raises(ValueError, match="keep_rounds"):
        MemoryHub(keep_rounds=0)
    node.close()
    with pytest.raises(RuntimeError, match="closed"):
        node.fetch(0)


# ---- fetch_valid with hostile peers ----------------------------------------------------------------


def _raw(obj):
    return msgpack.packb(obj, use_bin_type=True)


def test_fetch_valid_skips_and_counts_every_hostile_payload():
    limits = PayloadLimits(max_bytes=4096, max_group_size=4)
    hub = MemoryHub()
    good = {"v": 1, "model_name": "m", "round": 5}
    one_group = [{"question": "q", "answer": "a", "task": "t", "meta": {}, "completions": ["c"]}]
    hostile = {
        "h-oversized": b"\x90" * 5000,
        "h-types": _raw({**good, "peer_id": "h-types", "groups": "not a list"}),
        "h-utf8": _raw({**good, "peer_id": "h-utf8", "groups": one_group}).replace(b"\xa1q", b"\xa1\xff"),
        "h-group": _raw({**good, "peer_id": "h-group", "groups": [{**one_group[0], "completions": ["c"] * 5}]}),
        "h-round": _raw({**good, "round": -5, "peer_id": "h-round", "groups": one_group}),
        "h-fields": _raw({**good, "peer_id": "h-fields", "groups": one_group, "pickle": "cos\nsystem"}),
        "h-trunc": _raw({**good, "peer_id": "h-trunc", "groups": one_group})[:-3],
        "h-ext": _raw(msgpack.ExtType(42, b"\x00" * 8)),
        "h-deep": b"\x91" * 3000 + b"\xc0",
        "h-other-round": _raw({**good, "round": 4, "peer_id": "h-other-round", "groups": one_group}),
        "h-impostor": _raw({**good, "peer_id": "good-1", "groups": one_group}),
    }
    for peer, data in hostile.items():
        hub.put(5, peer, data)
    for peer in ("good-1", "good-2"):
        MemoryTransport(hub, peer).publish(5, encode(payload_of(peer, 5), limits))
    me = MemoryTransport(hub, "me")
    counter = SkipCounter()
    payloads = fetch_valid(me, 5, limits, counter)
    assert [p.peer_id for p in payloads] == ["good-1", "good-2"]
    assert counter.accepted == 2
    assert dict(counter.by_peer) == {peer: 1 for peer in hostile}
    assert dict(counter.by_reason) == {
        "too_large": 1,
        "bad_type": 1,
        "bad_utf8": 1,
        "group_size": 1,
        "bad_round": 1,
        "unknown_field": 1,
        "truncated": 1,
        "ext_type": 1,
        "too_deep": 1,
        "wrong_round": 1,
        "peer_mismatch": 1,
    }


class BrokenTransport:
    peer_id = "me"

    def fetch(self, round, exclude_self=True):
        raise ConnectionError("network down")


def test_fetch_valid_survives_a_failing_transport():
    counter = SkipCounter()
    assert fetch_valid(BrokenTransport(), 0, DEFAULT_LIMITS, counter) == []
    assert counter.by_reason == {"transport_error": 1}


# ---- file hub (several processes) --------------------------------------------------------------------

_CHILD = """
import sys
from lmrl.swarm.memory import FileHub, MemoryTransport
from lmrl.swarm.payload import Payload, QuestionGroup, encode
directory, peer = sys.argv[1], sys.argv[2]
node = MemoryTransport(FileHub(directory), peer)
for r in range(3):
    node.publish(r, encode(Payload(peer, "m", r, [QuestionGroup("q", "a", "t", {}, [peer + str(r)])])))
"""


def test_file_hub_lets_processes_swarm(tmp_path):
    procs = [subprocess.Popen([sys.executable, "-c", _CHILD, str(tmp_path), f"proc-{i}"], cwd=REPO) for i in range(3)]
    assert [p.wait(timeout=60) for p in procs] == [0, 0, 0]
    me = MemoryTransport(FileHub(tmp_path), "main")
    counter = SkipCounter()
    got = fetch_valid(me, 2, DEFAULT_LIMITS, counter)
    assert [(p.peer_id, p.groups[0].completions) for p in got] == [(f"proc-{i}", (f"proc-{i}2",)) for i in range(3)]
    assert counter.skipped == 0


def test_file_hub_expiry_and_odd_files(tmp_path):
    hub = FileHub(tmp_path, keep_rounds=2, max_entry_bytes=10)
    a, b = MemoryTransport(hub, "a/../x"), MemoryTransport(hub, "b")  # any id is safe: names are hex-encoded
    a.publish(0, b"r0")
    a.publish(1, b"r1")
    a.publish(2, b"r2")
    assert hub.rounds() == [1, 2]
    assert b.fetch(0) == [] and b.fetch(2) == [("a/../x", b"r2")]
    b.publish(0, b"late")  # b's own round 0: kept until b's own rounds move on
    b.publish(2, b"b2")  # b's window (keep 2) drops its round 0, and the round's folder with it
    assert hub.rounds() == [1, 2]
    folder = tmp_path / "round-000000000002"
    (folder / ".tmp-123").write_bytes(b"half-written")
    (folder / "zz-not-hex.msgpack").write_bytes(b"junk")
    (folder / "README").write_text("foreign file")
    (folder / (b"c".hex() + ".msgpack")).write_bytes(b"y" * 1000)  # a huge entry is read capped
    assert b.fetch(2) == [("a/../x", b"r2"), ("c", b"y" * 11)]
    counter = SkipCounter()
    assert fetch_valid(b, 2, PayloadLimits(max_bytes=10), counter) == []
    # "c": 11 bytes > 10 -> too_large. b"r2": 0x72 is the fixint 114, then "2" trails it -> bad_msgpack.
    assert counter.by_reason == {"too_large": 1, "bad_msgpack": 1}
    with pytest.raises(ValueError, match="max_entry_bytes"):
        a.publish(2, b"z" * 11)


@pytest.mark.parametrize("kind", ["memory", "file"])
def test_a_far_future_round_neither_wipes_nor_silences_the_hub(tmp_path, kind):
    hub = MemoryHub(keep_rounds=2) if kind == "memory" else FileHub(tmp_path, keep_rounds=2)
    a, b = MemoryTransport(hub, "a"), MemoryTransport(hub, "b")
    a.publish(1, b"a1")
    b.publish(1, b"b1")
    hub.put(10**9, "hostile", b"x")  # or a node with another round_seconds
    a.publish(2, b"a2")
    b.publish(2, b"b2")
    assert a.fetch(1) == [("b", b"b1")] and a.fetch(2) == [("b", b"b2")] and b.fetch(2) == [("a", b"a2")]
    assert 1 in hub.rounds() and 2 in hub.rounds()


@pytest.mark.parametrize("kind", ["memory", "file"])
def test_a_fetch_is_capped_in_peers_and_bytes(tmp_path, kind):
    caps = {"max_fetch_peers": 5, "max_fetch_bytes": 1000}
    hub = MemoryHub(**caps) if kind == "memory" else FileHub(tmp_path, **caps)
    for i in range(50):
        hub.put(0, f"p{i:02d}", b"x" * 10)
    got = MemoryTransport(hub, "me").fetch(0)
    assert len(got) == 5
    for i in range(50):
        hub.put(1, f"p{i:02d}", b"x" * 300)
    got = MemoryTransport(hub, "me").fetch(1)
    assert len(got) == 3 and sum(len(d) for _, d in got) <= 1000


def test_a_fifo_in_the_file_hub_does_not_hang_a_fetch(tmp_path):
    import os
    import threading

    hub = FileHub(tmp_path)
    MemoryTransport(hub, "a").publish(0, b"a0")
    os.mkfifo(tmp_path / "round-000000000000" / (b"evil".hex() + ".msgpack"))
    result = []
    thread = threading.Thread(target=lambda: result.append(MemoryTransport(hub, "b").fetch(0)), daemon=True)
    thread.start()
    thread.join(10)
    assert result == [[("a", b"a0")]], "the fetch hung on a FIFO"
