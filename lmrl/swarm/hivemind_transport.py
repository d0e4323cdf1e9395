"""`HivemindTransport`: SAPO payloads over hivemind's Kademlia DHT on libp2p (the real swarm).

Install with ``pip install hivemind==1.1.12`` (the PyPI wheel bundles the Go
``p2pd``; source builds download it and fail offline). Layout in the DHT, all
entries expiring `expiration_s` after publication (genrl uses 600 s):

    <ns>:round:<r>                              subkey = owner -> manifest {size, sha256, chunks, chunk_bytes}
    <ns>:round:<r>:<peer>:<sha256 prefix>:<i>   subkey = owner -> bytes of chunk i

`owner` is hivemind's ``[owner:<RSA public key>]`` marker and every record is
signed with the node's libp2p identity key (`RSASignatureValidator`), so the
sender's peer id is *derived from the key that signed it*: nobody can publish
under another node's id. A validator on every lmrl node refuses unsigned
records and values that are not bytes of bounded size, at store time and on
every lookup result.

Size limits in hivemind 1.1.12 (measured here, read from its code):
- ``hivemind.DHT`` runs the node in a forked process fed through a
  ``multiprocessing`` pipe that uvloop's ``add_reader`` makes non-blocking: a
  store/get command over 64 KiB (the Linux pipe capacity; over 16 KiB
  ``multiprocessing`` already writes header and body separately) makes the
  child's ``recv`` hit ``BlockingIOError [Errno 11]`` and the DHT process dies
  (60 KB values worked, 70 KB killed it). This is rl-swarm's "Errno 11" crash.
  We therefore run ``DHTNode`` in a thread of this process (no fork, no pipe).
- Every DHT RPC (one store or find, possibly batching several values) is one
  libp2p unary message capped at ``DEFAULT_MAX_MSG_SIZE`` = 4 MiB
  (``hivemind/p2p/p2p_daemon_bindings/control.py``); a larger response is
  replaced by an error. Payloads are capped at 2 MiB and split into
  `chunk_bytes` (32 KiB) values, so they spread over the DHT's nodes and stay
  far below every limit, also for peers that use ``hivemind.DHT``.

Limits of the design (hivemind has no per-key write access control): anyone may
add *their own* signed subkeys under any key, so a Sybil attacker with many keys
can inflate a round's index; `max_peers` bounds what one fetch reads, and
payloads are still decoded and checked by `fetch_valid`.

Options and size limits: `lmrl.swarm.hivemind_options`; identities, peer ids and the record
validator: `lmrl.swarm.hivemind_identity`; the guarded hivemind import: `lmrl.swarm.hivemind_import`.
"""

from __future__ import annotations

import asyncio
import atexit
import hashlib
import logging
import math
import os
import random
import shutil
import tempfile
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

import msgpack

from lmrl.swarm.hivemind_identity import SwarmRecordValidator, load_or_create_identity, owner_peer_id, peer_id_of
from lmrl.swarm.hivemind_import import DHTNode, get_dht_time
from lmrl.swarm.hivemind_options import MAX_VALUE_BYTES, MIN_CHUNK_BYTES, HivemindOptions, record_lifetime
from lmrl.swarm.transport import SkipCounter, check_round

logger = logging.getLogger(__name__)

T = TypeVar("T")


class SwarmStartupError(RuntimeError):
    """The DHT node could not start or join the swarm; the message says what to check."""


class HivemindTransport:
    """`Transport` over a hivemind DHT node running in a background thread of this process.

        transport = HivemindTransport(HivemindOptions(identity_path="swarm.key",
                                                      initial_peers=("/ip4/1.2.3.4/tcp/31337/p2p/Qm...",)))
        transport.publish(round, encode(payload))
        payloads = fetch_valid(transport, round, limits, counter)

    `stats` counts entries skipped at the transport level (unsigned, bad manifest,
    incomplete, digest mismatch, too many peers); `publish_failures` counts
    publishes that did not reach the DHT.
    """

    def __init__(self, options: HivemindOptions = HivemindOptions()) -> None:  # noqa: B008 - frozen, shared safely
        self.options = options
        self.stats = SkipCounter()
        self.publish_failures = 0
        self._last_publish: float | None = None  # DHT time of the previous publish: the node's publishing rate
        self._expirations: dict[int, float] = {}  # round -> its records' expiration: a republish must outlive it
        self._closed = False
        self._tmpdir: str | None = None
        if options.identity_path is None:
            self._tmpdir = tempfile.mkdtemp(prefix="lmrl-swarm-")
            identity_path = os.path.join(self._tmpdir, "identity.key")
        else:
            identity_path = os.fspath(options.identity_path)
        # A key file made just now cannot be in use elsewhere: skip hivemind's check (it starts a second daemon).
        self._check_identity = os.path.exists(identity_path)
        try:
            self._validator = SwarmRecordValidator(load_or_create_identity(identity_path))
        except BaseException:
            self._remove_tmpdir()
            raise
        self._owner = self._validator.local_public_key  # b"[owner:ssh-rsa ...]"
        self._peer_id = peer_id_of(self._validator._private_key.get_public_key())
        self._rng = random.Random()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="lmrl-swarm-dht", daemon=True)
        self._thread.start()
        try:
            self._node = self._start(identity_path)
            self.visible_maddrs = [str(m) for m in self._run(self._node.p2p.get_visible_maddrs(), 30.0)]
        except BaseException:
            self._stop_loop()
            raise
        if self._node.peer_id.to_base58() != self._peer_id:  # the daemon must sign with the key we sign with
            self.close()
            raise SwarmStartupError(f"p2p daemon runs as {self._node.peer_id} but the identity key is {self._peer_id}.")
        atexit.register(self.close)
        logger.info("swarm: node %s listening on %s", self._peer_id, self.visible_maddrs)

    # -- plumbing

    def _run(self, coro: Coroutine[Any, Any, T], timeout: float) -> T:
        """Run `coro` on the DHT thread's loop; cancel it and raise TimeoutError after `timeout` seconds."""
        return asyncio.run_coroutine_threadsafe(asyncio.wait_for(coro, timeout), self._loop).result(timeout + 5.0)

    def _start(self, identity_path: str) -> DHTNode:
        opts = self.options
        kwargs: dict[str, Any] = dict(
            initial_peers=list(opts.initial_peers) or None,
            host_maddrs=list(opts.host_maddrs),
            identity_path=identity_path,
            record_validator=self._validator,
            client_mode=opts.client_mode,
            startup_timeout=opts.startup_timeout_s,
            check_if_identity_free=self._check_identity,
        )
        if opts.announce_maddrs:
            kwargs["announce_maddrs"] = list(opts.announce_maddrs)
        last: BaseException | None = None
        for attempt in range(opts.startup_attempts):
            if attempt:
                pause = 2.0**attempt
                logger.warning("swarm: joining failed (%s); retrying in %.0f s", last, pause)
                threading.Event().wait(pause)
            try:
                return self._run(DHTNode.create(**kwargs), opts.startup_timeout_s * 2)
            except Exception as err:  # noqa: BLE001 - reported below with what to check
                last = err
                if "already taken" in str(err):
                    break  # retrying cannot help
        if last is not None and "already taken" in str(last):
            hint = (
                "Another running node uses this identity file (is the previous process still alive?); stop it "
                "or use another identity_path."
            )
        elif opts.initial_peers:
            hint = (
                f"Check that the initial peers {list(opts.initial_peers)} are running and reachable from here "
                "(address, port, firewall), or leave initial_peers empty to start a new swarm."
            )
        else:
            hint = (
                "The p2p daemon (hivemind's bundled p2pd) did not start; check that hivemind was installed from "
                "the PyPI wheel and that host_maddrs is a free local address."
            )
        raise SwarmStartupError(
            f"Could not start the hivemind DHT node after {opts.startup_attempts} attempt(s): "
            f"{type(last).__name__}: {last}. {hint}"
        ) from last

    def _round_key(self, round: int) -> str:
        return f"{self.options.namespace}:round:{round}"

    def _chunk_key(self, round: int, peer_id: str, digest: bytes, index: int) -> str:
        return f"{self._round_key(round)}:{peer_id}:{digest.hex()[:32]}:{index}"

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError(f"HivemindTransport of {self._peer_id} is closed; create a new one to rejoin.")

    # -- Transport

    @property
    def peer_id(self) -> str:
        return self._peer_id

    def publish(self, round: int, payload: bytes) -> None:
        self._check_open()
        check_round(round)
        if not isinstance(payload, (bytes, bytearray)):
            raise TypeError(f"publish() takes the encoded payload bytes, got {type(payload).__name__}; use encode().")
        if not 0 < len(payload) <= self.options.max_payload_bytes:
            raise ValueError(
                f"payload of {len(payload)} bytes is outside (0, max_payload_bytes={self.options.max_payload_bytes}]; "
                "share fewer groups per round or raise max_payload_bytes (and PayloadLimits.max_bytes) everywhere."
            )
        try:
            ok = self._run(self._publish(round, bytes(payload)), self.options.publish_timeout_s)
        except Exception as err:  # noqa: BLE001 - the network must not stop training
            ok, reason = False, f"{type(err).__name__}: {err}"
        else:
            reason = "no DHT peer accepted every record"
        if not ok:
            self.publish_failures += 1
            logger.warning("swarm: publishing round %d failed (%s); peers will not see it", round, reason)

    async def _publish(self, round: int, data: bytes) -> bool:
        size, cb = len(data), self.options.chunk_bytes
        digest = hashlib.sha256(data).digest()
        chunks = [data[i : i + cb] for i in range(0, size, cb)]
        now = get_dht_time()
        interval, self._last_publish = (None if self._last_publish is None else now - self._last_publish), now
        expiration = now + record_lifetime(self.options.expiration_s, interval, size, cb)  # within peers' budgets
        # the DHT keeps the later expiration of a key: a round published again (a retry, a correction) replaces the
        # earlier entry only if it expires later, even when the publishing rate shortened its lifetime
        expiration = max(expiration, self._expirations.get(round, 0.0) + 1e-3)
        self._expirations = {r: t for r, t in self._expirations.items() if t > now}  # forget expired rounds
        self._expirations[round] = expiration
        keys = [self._chunk_key(round, self._peer_id, digest, i) for i in range(len(chunks))]
        stored = await self._node.store_many(keys, chunks, expiration, subkeys=[self._owner] * len(keys))
        if not all(stored.values()):
            return False  # announce nothing that cannot be read back
        manifest = msgpack.packb({"size": size, "sha256": digest, "chunks": len(chunks), "chunk_bytes": cb})
        return await self._node.store(self._round_key(round), manifest, expiration, subkey=self._owner)

    def fetch(self, round: int, exclude_self: bool = True) -> list[tuple[str, bytes]]:
        self._check_open()
        check_round(round)
        timeout = self.options.fetch_timeout_s
        try:
            return self._run(self._fetch(round, exclude_self, deadline=self._loop.time() + timeout), timeout + 1.0)
        except Exception as err:  # noqa: BLE001 - no peer data this round, but no crash either
            self.stats.skip(self._peer_id, "transport_error")
            logger.warning("swarm: fetching round %d failed (%s: %s)", round, type(err).__name__, err)
            return []

    async def _fetch(self, round: int, exclude_self: bool, deadline: float) -> list[tuple[str, bytes]]:
        index = await asyncio.wait_for(
            self._node.get(self._round_key(round), latest=True), max(0.1, deadline - self._loop.time())
        )
        if index is None:
            return []
        if not isinstance(index.value, dict):
            self.stats.skip("?", "bad_manifest")
            return []
        manifests: dict[str, tuple[bytes, dict]] = {}
        for subkey, entry in index.value.items():
            peer = owner_peer_id(subkey)
            if peer is None:
                self.stats.skip("?", "unsigned")  # only reachable with hivemind nodes lacking our validator
                continue
            if exclude_self and peer == self._peer_id:
                continue
            manifest = self._parse_manifest(entry.value)
            if manifest is None:
                self.stats.skip(peer, "bad_manifest")
                continue
            manifests[peer] = (subkey, manifest)
        peers = sorted(manifests)
        if len(peers) > self.options.max_peers:
            chosen = set(self._rng.sample(peers, self.options.max_peers))  # random: a flood cannot crowd out by id
            for peer in peers:
                if peer not in chosen:
                    self.stats.skip(peer, "too_many_peers")
            peers = sorted(chosen)
        tasks = {peer: asyncio.ensure_future(self._fetch_chunks(round, peer, *manifests[peer])) for peer in peers}
        if not tasks:
            return []
        await asyncio.wait(tasks.values(), timeout=max(0.1, deadline - self._loop.time()))
        out = []
        for peer, task in tasks.items():
            if not task.done() or task.cancelled():
                task.cancel()
                self.stats.skip(peer, "incomplete")
            elif task.exception() is not None:
                logger.info("swarm: reading chunks of %s failed: %r", peer, task.exception())
                self.stats.skip(peer, "incomplete")
            elif isinstance(task.result(), str):
                self.stats.skip(peer, task.result())
            else:
                out.append((peer, task.result()))
        return out

    def _parse_manifest(self, value: Any) -> dict | None:
        """The manifest dict if `value` is a well-formed, self-consistent one within our limits, else None."""
        if not isinstance(value, bytes) or len(value) > 1024:
            return None
        try:
            manifest = msgpack.unpackb(value, raw=False, strict_map_key=True)
        except Exception:  # noqa: BLE001 - anything undecodable is malformed
            return None
        if not isinstance(manifest, dict) or set(manifest) != {"size", "sha256", "chunks", "chunk_bytes"}:
            return None
        size, digest, chunks, cb = manifest["size"], manifest["sha256"], manifest["chunks"], manifest["chunk_bytes"]
        if not all(isinstance(x, int) and not isinstance(x, bool) for x in (size, chunks, cb)):
            return None
        if not isinstance(digest, bytes) or len(digest) != 32:
            return None
        if not (1 <= size <= self.options.max_payload_bytes and MIN_CHUNK_BYTES <= cb <= MAX_VALUE_BYTES):
            return None
        if chunks != math.ceil(size / cb):
            return None
        return manifest

    async def _fetch_chunks(self, round: int, peer: str, owner: bytes, manifest: dict) -> bytes | str:
        """The payload bytes of `peer`, or a skip reason."""
        digest = manifest["sha256"]
        keys = [self._chunk_key(round, peer, digest, i) for i in range(manifest["chunks"])]
        found = await self._node.get_many(keys)
        parts = []
        for key in keys:
            entry = found.get(key)
            value = entry.value if entry is not None else None
            item = value.get(owner) if isinstance(value, dict) else None  # the owner's own subkey only
            if item is None or not isinstance(item.value, bytes):
                return "incomplete"
            parts.append(item.value)
        data = b"".join(parts)
        if len(data) != manifest["size"] or hashlib.sha256(data).digest() != digest:
            return "digest_mismatch"
        return data

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        atexit.unregister(self.close)
        try:
            self._run(self._node.shutdown(), 15.0)
        except Exception as err:  # noqa: BLE001 - best effort; the daemon also exits when its client is gone
            logger.warning("swarm: DHT shutdown did not finish cleanly: %r", err)
        self._stop_loop()

    def _stop_loop(self) -> None:
        async def cancel_pending() -> None:  # hivemind's background refresh tasks would die noisily
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        try:
            self._run(cancel_pending(), 5.0)
        except Exception:  # noqa: BLE001 - stopping the loop below ends them anyway
            pass
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10.0)
        if not self._thread.is_alive():
            self._loop.close()
        self._remove_tmpdir()

    def _remove_tmpdir(self) -> None:
        if self._tmpdir is not None:
            shutil.rmtree(self._tmpdir, ignore_errors=True)

    def __enter__(self) -> HivemindTransport:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
