"""HivemindTransport on loopback: exchange, chunking, signed identities, hostile DHT entries, restart."""

import asyncio
import dataclasses
import hashlib
import importlib.util
import math
import os
import stat
import sys
import threading
import time

import msgpack
import pytest
import torch.multiprocessing

if importlib.util.find_spec("hivemind") is None:  # not importorskip: that would import hivemind first
    pytest.skip("hivemind is not installed (optional extra `swarm`)", allow_module_level=True)

# Imported before hivemind itself, as an application would (see the sharing-strategy test).
from lmrl.swarm.hivemind_identity import (  # noqa: E402
    SwarmRecordValidator,
    load_or_create_identity,
    owner_peer_id,
    peer_id_of,
)
from lmrl.swarm.hivemind_transport import HivemindOptions, HivemindTransport, SwarmStartupError  # noqa: E402

# isort: split
from hivemind.dht.node import DHTNode  # noqa: E402
from hivemind.dht.validation import DHTRecord  # noqa: E402
from hivemind.p2p.p2p_daemon_bindings.datastructures import PeerID  # noqa: E402
from hivemind.utils.serializer import MSGPackSerializer  # noqa: E402
from hivemind.utils.timed_storage import get_dht_time  # noqa: E402

# isort: split
from lmrl.swarm.payload import DEFAULT_LIMITS, Payload, QuestionGroup, encode  # noqa: E402
from lmrl.swarm.transport import SkipCounter, Transport, fetch_valid  # noqa: E402

LOOPBACK = ("/ip4/127.0.0.1/tcp/0",)
DEADLINE_S = 30.0


def payload_of(peer, round_, text="4", n_groups=2):
    groups = [QuestionGroup(f"{i}+2=", "4", "arithmetic", {"i": i}, [text, "5"]) for i in range(n_groups)]
    return Payload(peer, "builtin:tiny", round_, groups)


def fetch_until(transport, round_, n_expected, limits=DEFAULT_LIMITS, counter=None):
    """fetch_valid until `n_expected` payloads arrived or DEADLINE_S passed (DHT stores are acknowledged
    before publish returns, so one pass normally suffices; the loop only absorbs CPU contention)."""
    counter = counter if counter is not None else SkipCounter()
    deadline = time.monotonic() + DEADLINE_S
    while True:
        got = fetch_valid(transport, round_, limits, counter)
        if len(got) >= n_expected or time.monotonic() > deadline:
            return got
        time.sleep(0.5)


@pytest.fixture(scope="module")
def swarm():
    start = time.monotonic()
    first = HivemindTransport(HivemindOptions(host_maddrs=LOOPBACK))
    options = HivemindOptions(host_maddrs=LOOPBACK, initial_peers=tuple(first.visible_maddrs))
    nodes = [first, HivemindTransport(options), HivemindTransport(options)]
    startup_s = time.monotonic() - start
    yield nodes, options, startup_s
    for node in nodes:
        node.close()


def test_three_nodes_exchange_rollouts_within_seconds(swarm):
    nodes, _, startup_s = swarm
    assert startup_s < 60, f"3 nodes took {startup_s:.1f} s to start"
    assert all(isinstance(node, Transport) for node in nodes)
    assert len({node.peer_id for node in nodes}) == 3
    start = time.monotonic()
    for node in nodes:
        node.publish(1, encode(payload_of(node.peer_id, 1, text=f"from {node.peer_id}")))
    for node in nodes:
        got = fetch_until(node, 1, 2)
        others = sorted(n.peer_id for n in nodes if n is not node)
        assert sorted(p.peer_id for p in got) == others
        assert all(p.groups[0].completions[0] == f"from {p.peer_id}" for p in got)
        assert node.publish_failures == 0
    assert time.monotonic() - start < 10, "publishing and fetching on loopback should take seconds"
    assert sorted(p for p, _ in nodes[0].fetch(1, exclude_self=False)) == sorted(n.peer_id for n in nodes)


def test_large_payload_is_chunked_and_reassembled(swarm):
    nodes, _, _ = swarm
    sender, receiver = nodes[1], nodes[2]
    # 48 groups, each with one 10,000-char completion: ~482 KB, i.e. ceil(482 KB / 32 KiB) = 15 chunks.
    data = encode(payload_of(sender.peer_id, 2, text="7" * 10_000, n_groups=48))
    assert 400_000 < len(data) < DEFAULT_LIMITS.max_bytes
    sender.publish(2, data)
    index = sender._run(sender._node.get(sender._round_key(2), latest=True), 10)
    manifest = msgpack.unpackb(index.value[sender._owner].value)
    assert manifest["chunks"] == math.ceil(len(data) / 32768) and manifest["size"] == len(data)
    assert manifest["sha256"] == hashlib.sha256(data).digest()
    got = dict(receiver.fetch(2))
    assert got[sender.peer_id] == data


def test_republishing_a_round_replaces_the_entry(swarm):
    nodes, _, _ = swarm
    sender, receiver = nodes[0], nodes[1]
    sender.publish(3, encode(payload_of(sender.peer_id, 3, text="old")))
    time.sleep(0.05)  # a later expiration time wins in the DHT
    sender.publish(3, encode(payload_of(sender.peer_id, 3, text="new")))
    (payload,) = [p for p in fetch_until(receiver, 3, 1) if p.peer_id == sender.peer_id]
    assert payload.groups[0].completions[0] == "new"


def test_entries_expire_after_expiration_s(swarm):
    nodes, options, _ = swarm
    with HivemindTransport(dataclasses.replace(options, expiration_s=3.0)) as short_lived:
        published = time.monotonic()
        short_lived.publish(4, encode(payload_of(short_lived.peer_id, 4)))
        got = nodes[0].fetch(4)
        assert [peer for peer, _ in got] == [short_lived.peer_id]
        assert time.monotonic() - published < 3.0, "too slow to observe the entry before it expires"
        time.sleep(3.5 - (time.monotonic() - published))
        assert nodes[0].fetch(4) == [] and nodes[1].fetch(4) == []


def test_peer_id_is_the_libp2p_id_of_the_signing_key(swarm, tmp_path):
    nodes, _, _ = swarm
    for node in nodes:
        assert node._node.peer_id.to_base58() == node.peer_id
        assert owner_peer_id(node._owner) == node.peer_id
    key_file = tmp_path / "id.key"
    key = load_or_create_identity(key_file)
    assert peer_id_of(key.get_public_key()) == PeerID.from_identity(key_file.read_bytes()).to_base58()


def _store_as(node, key, value, subkey=None):
    """Store a raw record through `node`'s DHT, signed with its key: what a hostile lmrl peer can do."""
    subkey = node._owner if subkey is None else subkey
    return node._run(node._node.store(key, value, get_dht_time() + 60, subkey=subkey), 10)


def test_hostile_dht_entries_are_skipped_and_counted(swarm):
    nodes, options, _ = swarm
    honest, reader = nodes[0], nodes[1]
    with HivemindTransport(options) as attacker:
        rounds = {"bad_manifest": 10, "incomplete": 11, "digest_mismatch": 12, "peer_mismatch": 13}
        for round_ in rounds.values():
            honest.publish(round_, encode(payload_of(honest.peer_id, round_)))
        # A signed manifest that is not one.
        assert _store_as(attacker, attacker._round_key(10), msgpack.packb({"size": "big"}))
        # A manifest for chunks that were never stored.
        digest = hashlib.sha256(b"x" * 8000).digest()
        manifest = {"size": 8000, "sha256": digest, "chunks": 2, "chunk_bytes": 4096}  # ceil(8000 / 4096) = 2
        assert _store_as(attacker, attacker._round_key(11), msgpack.packb(manifest))
        # Chunks whose content does not match the announced hash.
        for i in range(2):
            assert _store_as(attacker, attacker._chunk_key(12, attacker.peer_id, digest, i), b"y" * 4000)
        assert _store_as(attacker, attacker._round_key(12), msgpack.packb(manifest))
        # A well-formed payload that claims to come from the honest node.
        attacker.publish(13, encode(payload_of(honest.peer_id, 13)))

        for reason, round_ in rounds.items():
            counter = SkipCounter()
            before = reader.stats.by_reason[reason]
            got = fetch_until(reader, round_, 1, counter=counter)
            assert [p.peer_id for p in got] == [honest.peer_id], reason
            transport_level = reader.stats.by_reason[reason] - before
            assert transport_level + counter.by_reason[reason] == 1, reason
        assert reader.stats.by_peer[attacker.peer_id] >= 3


def test_manifests_are_parsed_strictly(swarm):
    node = swarm[0][0]
    digest = bytes(32)
    good = {"size": 70_000, "sha256": digest, "chunks": 3, "chunk_bytes": 32768}  # ceil(70000 / 32768) = 3
    assert node._parse_manifest(msgpack.packb(good)) == good
    bad = [
        {**good, "chunks": 2},  # inconsistent with size / chunk_bytes
        {**good, "size": 0},
        {**good, "size": (1 << 20) + 1, "chunks": 33},  # above max_payload_bytes (ceil(1048577 / 32768) = 33)
        {**good, "chunk_bytes": 1024, "chunks": 69},  # below the 4 KiB minimum chunk
        {**good, "sha256": bytes(31)},
        {**good, "size": True},
        {**good, "extra": 1},
        {k: v for k, v in good.items() if k != "chunks"},
    ]
    for manifest in bad:
        assert node._parse_manifest(msgpack.packb(manifest)) is None, manifest
    assert node._parse_manifest(b"\xc1") is None
    assert node._parse_manifest("not bytes") is None
    assert node._parse_manifest(msgpack.packb({**good, "pad": "x" * 2000})) is None  # over 1 KiB


def test_validator_accepts_only_signed_bounded_bytes(tmp_path):
    validator = SwarmRecordValidator(load_or_create_identity(tmp_path / "k"))
    owner = MSGPackSerializer.dumps(validator.local_public_key)

    def record(value, subkey=owner):
        rec = DHTRecord(b"k" * 20, subkey, MSGPackSerializer.dumps(value), get_dht_time() + 60)
        return dataclasses.replace(rec, value=validator.sign_value(rec))

    assert validator.validate(record(b"chunk"))
    assert not validator.validate(record(12345))  # not bytes
    assert not validator.validate(record(b"x" * (256 * 1024 + 1)))  # above MAX_VALUE_BYTES
    unsigned = DHTRecord(
        b"k" * 20, MSGPackSerializer.dumps(b"fake"), MSGPackSerializer.dumps(b"v"), get_dht_time() + 60
    )
    assert not validator.validate(unsigned)
    good = record(b"chunk")
    tampered = dataclasses.replace(good, value=good.value.replace(b"chunk", b"chunK"))
    assert not validator.validate(tampered)


def test_validator_bounds_expiration_and_each_owners_bytes(tmp_path):
    validator = SwarmRecordValidator(load_or_create_identity(tmp_path / "k"), budget_bytes=600 * 1024)
    owner = MSGPackSerializer.dumps(validator.local_public_key)

    def record(key, value, expires_in):
        rec = DHTRecord(key, owner, MSGPackSerializer.dumps(value), get_dht_time() + expires_in)
        return dataclasses.replace(rec, value=validator.sign_value(rec))

    assert not validator.validate(record(b"a" * 20, b"x", 10 * 365 * 86400))  # a 10-year entry
    assert validator.validate(record(b"a" * 20, b"x", 600))
    chunk = b"y" * (200 * 1024)
    assert validator.validate(record(b"b" * 20, chunk, 600)) and validator.validate(record(b"c" * 20, chunk, 600))
    assert not validator.validate(record(b"d" * 20, chunk, 600))  # a third 200 KiB record: over the 600 KiB budget
    assert validator.validate(record(b"b" * 20, chunk, 600))  # re-storing a held record replaces it
    other = SwarmRecordValidator(load_or_create_identity(tmp_path / "k2"))
    assert other.validate(record(b"d" * 20, chunk, 600))  # the budget is per owner and per node


class _LoopThread:
    def __init__(self):
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro, timeout=30):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def stop(self):
        async def cancel_pending():  # hivemind's background refresh tasks
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        self.run(cancel_pending(), timeout=10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)


def test_unsigned_entries_from_a_plain_hivemind_node_never_reach_fetch(swarm):
    """A hivemind node without our validator stores an unsigned junk subkey under a round key: lmrl nodes
    refuse to store it, drop any lookup response that carries it, and still read the honest entries."""
    nodes, options, _ = swarm
    honest, reader = nodes[2], nodes[0]
    honest.publish(20, encode(payload_of(honest.peer_id, 20)))
    loop = _LoopThread()
    try:
        raw = loop.run(DHTNode.create(initial_peers=list(options.initial_peers), host_maddrs=list(LOOPBACK)))
        loop.run(raw.store(reader._round_key(20), b"\xc1junk", get_dht_time() + 60, subkey=b"fake-owner"))
        got = fetch_until(reader, 20, 1)
        assert [p.peer_id for p in got] == [honest.peer_id]
        loop.run(raw.shutdown())
    finally:
        loop.stop()


def test_restart_with_the_same_identity_file_keeps_the_peer_id(swarm, tmp_path):
    nodes, options, _ = swarm
    identity = tmp_path / "keys" / "node.key"
    restart_options = dataclasses.replace(options, identity_path=str(identity))
    with HivemindTransport(restart_options) as node:
        first_id = node.peer_id
        node.publish(30, encode(payload_of(first_id, 30)))
    assert stat.S_IMODE(os.stat(identity).st_mode) == 0o400
    with HivemindTransport(restart_options) as node:  # hivemind checks the identity is free, then reuses it
        assert node.peer_id == first_id
        node.publish(31, encode(payload_of(first_id, 31)))
        assert [p.peer_id for p in fetch_until(nodes[0], 31, 1)] == [first_id]


def test_startup_errors_say_what_to_check(tmp_path):
    dead_peer = "/ip4/127.0.0.1/tcp/9/p2p/QmTnPDCdb5nptkXogQYD4mnkKEm6eCp5YpV2zDWdbdBmcp"  # port 9: discard
    options = HivemindOptions(host_maddrs=LOOPBACK, initial_peers=(dead_peer,), startup_attempts=1)
    with pytest.raises(SwarmStartupError, match="initial peers"):
        HivemindTransport(options)
    bad_key = tmp_path / "bad.key"
    bad_key.write_bytes(b"not a key")
    with pytest.raises(ValueError, match="not a libp2p RSA private key"):
        HivemindTransport(HivemindOptions(host_maddrs=LOOPBACK, identity_path=str(bad_key)))


def test_options_are_validated():
    with pytest.raises(ValueError, match="not a multiaddr"):
        HivemindOptions(initial_peers=("1.2.3.4:31337",))
    with pytest.raises(ValueError, match="/p2p/"):
        HivemindOptions(initial_peers=("/ip4/1.2.3.4/tcp/31337",))
    with pytest.raises(ValueError, match="list of multiaddrs"):
        HivemindOptions(initial_peers="/ip4/1.2.3.4/tcp/31337/p2p/QmTnPDCdb5nptkXogQYD4mnkKEm6eCp5YpV2zDWdbdBmcp")
    with pytest.raises(ValueError, match="chunk_bytes"):
        HivemindOptions(chunk_bytes=10**7)
    with pytest.raises(ValueError, match="max_payload_bytes"):
        HivemindOptions(max_payload_bytes=8 << 20)
    assert HivemindOptions(initial_peers=["/ip4/1.2.3.4/tcp/1/p2p/QmTnPDCdb5nptkXogQYD4mnkKEm6eCp5YpV2zDWdbdBmcp"])


@pytest.mark.skipif(sys.platform != "linux", reason="torch's default sharing strategy differs elsewhere")
def test_importing_the_transport_keeps_torch_sharing_strategy():
    # hivemind's import sets "file_system" process-wide; the transport restores Linux's default.
    assert torch.multiprocessing.get_sharing_strategy() == "file_descriptor"


def test_publish_refuses_oversized_payloads(swarm):
    nodes, _, _ = swarm
    with pytest.raises(ValueError, match="max_payload_bytes"):
        nodes[0].publish(40, b"x" * ((1 << 20) + 1))
