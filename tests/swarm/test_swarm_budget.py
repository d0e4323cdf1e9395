"""The hivemind owner budget fits an honest node (issue 33): valid payloads near max_payload_bytes published every
few seconds, for longer than a record lives, are all accepted by a peer's validator; and two file-transport nodes
left at the default name are two peers."""

from __future__ import annotations

import importlib.util
import math

import pytest

from lmrl.swarm.cli import default_node_name

hivemind = pytest.mark.skipif(importlib.util.find_spec("hivemind") is None, reason="hivemind is not installed")


@hivemind
def test_a_node_publishing_near_limit_payloads_at_its_rate_loses_no_round(tmp_path):
    from hivemind.dht.validation import DHTRecord
    from hivemind.utils.serializer import MSGPackSerializer

    from lmrl.swarm.hivemind_identity import SwarmRecordValidator, load_or_create_identity
    from lmrl.swarm.hivemind_options import HivemindOptions, record_lifetime

    options = HivemindOptions(chunk_bytes=256 * 1024)  # max_payload_bytes 1 MiB, expiration_s 600
    payload, cb, period = 900_000, options.chunk_bytes, 3.0  # a valid 0.9 MB payload every 3 s, for 750 s
    peer = SwarmRecordValidator(load_or_create_identity(tmp_path / "peer"))
    publisher = SwarmRecordValidator(load_or_create_identity(tmp_path / "node"))
    owner = MSGPackSerializer.dumps(publisher.local_public_key)
    signed = publisher.sign_value(DHTRecord(b"k" * 20, owner, MSGPackSerializer.dumps(b"x" * cb), 0.0))
    overhead = len(signed) - cb  # msgpack header + signature marker of a real record

    def rounds_accepted(lifetime) -> int:
        validator = SwarmRecordValidator(peer._private_key)
        accepted = 0
        for r in range(250):
            now = 1000.0 + r * period
            expiration = now + lifetime(None if r == 0 else period)
            sizes = [min(cb, payload - i * cb) for i in range(math.ceil(payload / cb))] + [80]  # chunks + manifest
            records = [
                DHTRecord(
                    r.to_bytes(4, "big") + i.to_bytes(4, "big") + b"k" * 12, owner, b"v" * (size + overhead), expiration
                )
                for i, size in enumerate(sizes)
            ]
            accepted += all([validator._within_budget(owner, rec, now) for rec in records])
        return accepted

    assert rounds_accepted(lambda interval: record_lifetime(options.expiration_s, interval, payload, cb)) == 250
    # every record living expiration_s (before): the budget refuses most rounds once the first ones pile up
    assert rounds_accepted(lambda interval: options.expiration_s) < 250


def test_file_transport_nodes_left_at_the_default_name_are_distinct_and_keep_theirs(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    name_a, name_b = default_node_name(a), default_node_name(b)
    assert name_a != name_b and name_a.startswith("node-")
    assert default_node_name(a) == name_a  # resume keeps the peer id
