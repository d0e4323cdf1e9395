"""`HivemindOptions`: how a node joins a hivemind swarm, checked on construction, and the size limits behind them.

The limits follow hivemind 1.1.12's: every DHT RPC is one libp2p message capped at 4 MiB, so a payload
is capped at 2 MiB and split into chunks of at most 256 KiB (see `lmrl.swarm.hivemind_transport`).
"""

from __future__ import annotations

import dataclasses
import math

from lmrl.swarm.hivemind_import import Multiaddr

MAX_VALUE_BYTES = 256 * 1024
"""Largest DHT value any lmrl node stores or accepts (a chunk, or a manifest)."""
MAX_PAYLOAD_BYTES = 2 * 1024 * 1024
"""Hard cap of one payload: half of hivemind's 4 MiB RPC message limit."""
MAX_EXPIRATION_S = 3600.0
"""Longest lifetime a record may claim: nodes refuse records expiring later (no 10-year entries in their DHT)."""
MIN_CHUNK_BYTES = 4096
"""Smallest chunk a manifest may announce: bounds the lookups one peer can cause to max_payload_bytes / 4 KiB."""
RECORD_OVERHEAD_BYTES = 1024
"""What a stored record adds to its value, generously: the msgpack header and the RSA signature marker (~400 B)."""
MANIFEST_BYTES = 256
"""Largest manifest value ({size, sha256, chunks, chunk_bytes} in msgpack, ~80 B)."""


def round_bytes(payload_bytes: int, chunk_bytes: int) -> int:
    """What one published round counts against its owner's budget on a peer: its chunks and its manifest, each with
    the record overhead."""
    chunks = max(1, math.ceil(payload_bytes / chunk_bytes))
    return payload_bytes + MANIFEST_BYTES + (chunks + 1) * RECORD_OVERHEAD_BYTES


OWNER_BUDGET_ROUNDS = 8
OWNER_BUDGET_BYTES = OWNER_BUDGET_ROUNDS * round_bytes(MAX_PAYLOAD_BYTES, MIN_CHUNK_BYTES)
"""Bytes of unexpired records one owner may hold in a node's DHT storage: 8 rounds of the largest payload in the
smallest chunks (~20 MiB). A publisher keeps its own rounds within it by their lifetime (`record_lifetime`), so an
honest node at any payload size and publishing rate loses no round to it."""


def record_lifetime(expiration_s: float, interval_s: float | None, payload_bytes: int, chunk_bytes: int) -> float:
    """Seconds the records of a round live: ``expiration_s``, shortened when the node publishes so often (one round
    every ``interval_s``, the time since its previous publish) that its rounds alive at once would pass the owner
    budget every peer enforces: ``budget // round_bytes - 2`` rounds (spares: the first round, published before the
    rate is known, lives ``expiration_s``; and one that expires as the next is stored)."""
    if interval_s is None:
        return expiration_s
    rounds = OWNER_BUDGET_BYTES // round_bytes(payload_bytes, chunk_bytes) - 2
    return max(0.0, min(expiration_s, rounds * interval_s))


@dataclasses.dataclass(frozen=True)
class HivemindOptions:
    """How a node joins the hivemind swarm. Every node of one swarm uses the same `namespace`."""

    initial_peers: tuple[str, ...] = ()
    """Bootstrap multiaddrs, e.g. "/ip4/1.2.3.4/tcp/31337/p2p/Qm...". Empty: this node starts a new swarm
    (print `transport.visible_maddrs` and pass them to the others)."""
    host_maddrs: tuple[str, ...] = ("/ip4/0.0.0.0/tcp/0",)
    """Where to listen; port 0 picks a free port. Use "/ip4/127.0.0.1/tcp/0" for a single-machine swarm."""
    announce_maddrs: tuple[str, ...] = ()
    """Public addresses to announce when behind NAT/port forwarding (explicit ports)."""
    identity_path: str | None = None
    """libp2p private key file; created if missing and kept, so a restarted node keeps its peer id.
    None: a throwaway identity (new peer id every start)."""
    namespace: str = "lmrl-sapo"
    """Prefix of every DHT key; different swarms (or experiments) sharing a DHT use different ones."""
    expiration_s: float = 600.0
    """How long published entries live in the DHT (the staleness window, as genrl's 600 s)."""
    chunk_bytes: int = 32 * 1024
    """Payloads are split into DHT values of at most this many bytes."""
    max_payload_bytes: int = 1 << 20
    """Largest payload published or accepted (keep equal to `PayloadLimits.max_bytes`)."""
    max_peers: int = 256
    """Peers read per fetch; beyond it a random subset is read (and the rest counted `too_many_peers`)."""
    fetch_timeout_s: float = 10.0
    """Upper bound of one `fetch` (lookups that have not finished by then are counted `incomplete`)."""
    publish_timeout_s: float = 20.0
    """Upper bound of one `publish` (failures are logged and counted in `publish_failures`)."""
    startup_timeout_s: float = 60.0
    """Per attempt: start the p2p daemon and reach the initial peers."""
    startup_attempts: int = 3
    """Bootstrap attempts (with 2 s, 4 s, ... pauses) before giving up with `SwarmStartupError`."""
    client_mode: bool = False
    """True for nodes that cannot accept incoming connections: they read and write but store nothing."""

    def __post_init__(self) -> None:
        for name in ("initial_peers", "host_maddrs", "announce_maddrs"):
            value = getattr(self, name)
            if isinstance(value, str):
                raise ValueError(f"HivemindOptions.{name} must be a list of multiaddrs, got the string {value!r}.")
            object.__setattr__(self, name, tuple(value))
            for addr in getattr(self, name):
                try:
                    maddr = Multiaddr(addr)
                except Exception as err:  # noqa: BLE001 - multiaddr raises several types
                    raise ValueError(
                        f"HivemindOptions.{name} holds {addr!r}, which is not a multiaddr ({err}). Use the form "
                        "/ip4/1.2.3.4/tcp/31337/p2p/<peer id> as printed by the node you join."
                    ) from None
                if name == "initial_peers" and "p2p" not in [p.name for p in maddr.protocols()]:
                    raise ValueError(
                        f"initial peer {addr!r} lacks the /p2p/<peer id> part; copy the full address a running "
                        "node prints (transport.visible_maddrs)."
                    )
        if not self.namespace or ":" in self.namespace:
            raise ValueError(f"namespace must be a non-empty string without ':', got {self.namespace!r}.")
        if not MIN_CHUNK_BYTES <= self.chunk_bytes <= MAX_VALUE_BYTES:
            raise ValueError(f"chunk_bytes must lie in [{MIN_CHUNK_BYTES}, {MAX_VALUE_BYTES}], got {self.chunk_bytes}.")
        if not 1 <= self.max_payload_bytes <= MAX_PAYLOAD_BYTES:
            raise ValueError(
                f"max_payload_bytes must lie in [1, {MAX_PAYLOAD_BYTES}] (hivemind's RPC messages are capped at "
                f"4 MiB), got {self.max_payload_bytes}."
            )
        for name in ("expiration_s", "fetch_timeout_s", "publish_timeout_s", "startup_timeout_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"HivemindOptions.{name} must be > 0 seconds, got {getattr(self, name)}.")
        if self.expiration_s > MAX_EXPIRATION_S:
            raise ValueError(
                f"HivemindOptions.expiration_s must be <= {MAX_EXPIRATION_S:g} s (peers refuse records "
                f"that live longer), got {self.expiration_s}."
            )
        if self.max_peers < 1 or self.startup_attempts < 1:
            raise ValueError("HivemindOptions.max_peers and startup_attempts must be >= 1.")
