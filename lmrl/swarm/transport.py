"""How SAPO nodes exchange payloads: the `Transport` protocol, skip statistics, `fetch_valid`.

A transport moves opaque bytes keyed by round: `publish(round, data)` makes this
node's payload of that round available to its peers, `fetch(round)` returns
whatever has arrived from peers so far (SAPO is asynchronous: nobody waits for
stragglers, as in rl-swarm's HivemindBackend with its world size of 1). Backends:
`lmrl.swarm.memory` (threads or processes on one machine) and
`lmrl.swarm.hivemind_transport` (a libp2p DHT, the real swarm).

Nodes call `fetch_valid`, which decodes and validates every payload and *skips
and counts* anything bad, so a hostile or broken peer is never fatal.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from typing import Protocol, runtime_checkable

from lmrl.swarm.payload import REASONS, Payload, PayloadError, PayloadLimits, decode

logger = logging.getLogger(__name__)

TRANSPORT_REASONS: dict[str, str] = {
    "wrong_round": "the payload says another round than the one fetched",
    "peer_mismatch": "the payload's peer_id is not the peer that published it (impersonation)",
    "transport_error": "the transport itself failed while fetching (the round is skipped, not the run)",
    "unsigned": "a DHT entry without an owner signature, so its sender is unknown",
    "bad_manifest": "a DHT chunk index that is malformed or inconsistent",
    "incomplete": "some chunks of a payload were not found (yet) in the DHT",
    "digest_mismatch": "the reassembled chunks do not hash to the announced sha256",
    "too_many_peers": "more peers published this round than `max_peers`; the rest were not read",
}
"""Skip reasons added by transports and `fetch_valid`, on top of `payload.REASONS`."""

ALL_REASONS = {**REASONS, **TRANSPORT_REASONS}

OTHER_PEERS = "<other>"
"""The `SkipCounter.by_peer` bucket for peers beyond `max_tracked_peers` (Sybil floods)."""


def check_round(round: int) -> None:
    """Raise ValueError unless `round` is a non-negative int (what `publish`/`fetch` accept)."""
    if isinstance(round, bool) or not isinstance(round, int) or round < 0:
        raise ValueError(f"round must be a non-negative int, got {round!r}.")


@runtime_checkable
class Transport(Protocol):
    """Round-keyed exchange of opaque payload bytes between swarm nodes."""

    @property
    def peer_id(self) -> str:
        """This node's id as its peers see it (the sender name in their `fetch`)."""
        ...

    def publish(self, round: int, payload: bytes) -> None:
        """Make `payload` this node's entry for `round` (a second publish replaces the first).
        Network failures are logged and counted, never raised."""
        ...

    def fetch(self, round: int, exclude_self: bool = True) -> list[tuple[str, bytes]]:
        """`(peer_id, payload)` for every peer whose entry for `round` has arrived, in peer-id
        order. Never waits for missing peers beyond a small bounded timeout."""
        ...

    def close(self) -> None:
        """Release threads, files and sockets; idempotent."""
        ...


class SkipCounter:
    """Thread-safe counts of accepted and rejected payloads, by reason and by peer.

    `by_peer` tracks at most `max_tracked_peers` distinct peers; the rest are
    pooled under `OTHER_PEERS` so a flood of fake ids cannot grow memory."""

    def __init__(self, max_tracked_peers: int = 1024) -> None:
        if max_tracked_peers < 1:
            raise ValueError(f"max_tracked_peers must be >= 1, got {max_tracked_peers}.")
        self.max_tracked_peers = max_tracked_peers
        self.by_reason: Counter[str] = Counter()
        self.by_peer: Counter[str] = Counter()
        self.accepted = 0
        self._lock = threading.Lock()

    @property
    def skipped(self) -> int:
        with self._lock:
            return sum(self.by_reason.values())

    def skip(self, peer_id: str, reason: str) -> None:
        """Count one rejected payload (or transport failure) from `peer_id`."""
        if reason not in ALL_REASONS:
            raise ValueError(f"Unknown skip reason '{reason}'; known reasons: {sorted(ALL_REASONS)}.")
        with self._lock:
            self.by_reason[reason] += 1
            if peer_id in self.by_peer or len(self.by_peer) < self.max_tracked_peers:
                self.by_peer[peer_id] += 1
            else:
                self.by_peer[OTHER_PEERS] += 1

    def accept(self, count: int = 1) -> None:
        with self._lock:
            self.accepted += count

    def metrics(self, prefix: str = "swarm/") -> dict[str, int]:
        """Flat counters for `tracker.log`: `swarm/accepted`, `swarm/skipped`, `swarm/skipped/<reason>`."""
        with self._lock:
            out = {f"{prefix}accepted": self.accepted, f"{prefix}skipped": sum(self.by_reason.values())}
            out.update({f"{prefix}skipped/{reason}": n for reason, n in sorted(self.by_reason.items())})
        return out


def fetch_valid(
    transport: Transport, round: int, limits: PayloadLimits, counter: SkipCounter, exclude_self: bool = True
) -> list[Payload]:
    """The valid peer payloads of `round`; every bad one is skipped, counted and logged, never raised.

    A payload is valid if it decodes under `limits`, says `round`, and names as its
    `peer_id` the peer the transport received it from."""
    try:
        entries = transport.fetch(round, exclude_self=exclude_self)
    except Exception as err:  # noqa: BLE001 - a network failure costs this round's peer data, not the run
        logger.warning(
            "swarm: fetching round %d failed (%s: %s); training on own rollouts", round, type(err).__name__, err
        )
        counter.skip(transport.peer_id, "transport_error")
        return []
    payloads = []
    for sender, data in entries:
        try:
            payload = decode(data, limits)
        except PayloadError as err:
            logger.info("swarm: skipped payload of peer %.64s for round %d: %s", sender, round, err)
            counter.skip(sender, err.reason)
            continue
        if payload.round != round:
            logger.info("swarm: skipped payload of peer %.64s: round %d, expected %d", sender, payload.round, round)
            counter.skip(sender, "wrong_round")
            continue
        if payload.peer_id != sender:
            logger.info("swarm: skipped payload of peer %.64s claiming to be %.64s", sender, payload.peer_id)
            counter.skip(sender, "peer_mismatch")
            continue
        payloads.append(payload)
    counter.accept(len(payloads))
    return payloads
