"""Swarm transports on one machine: nodes as threads of one process, or as processes sharing a folder.

- `MemoryHub`: a locked dict in this process. For simulations and tests with
  nodes as threads (or sequential calls).
- `FileHub`: a directory, one file per (round, peer), written atomically
  (temp file + `os.replace`), so several processes (or a shared filesystem) can
  swarm with no server. Chosen over a `multiprocessing.Manager` dict because
  there is no broker process whose death takes every node down, it survives node
  restarts, and it works for processes that were not started by one parent.

Both keep the last `keep_rounds` rounds *of each node, by its own round*: when a
node publishes round r, its own entries of rounds <= r - keep_rounds are dropped
(and rounds left empty). A peer's round never decides what is pruned or ignored,
so a payload for a far-future round (a hostile peer, or a node with another
`round_seconds`) can neither wipe the hub nor silence the others; a node that
leaves leaves at most `keep_rounds` entries behind.

Fetches are bounded: at most `max_fetch_peers` entries and `max_fetch_bytes`
bytes (a random subset when there are more), and `FileHub` opens only regular
files, non-blocking (a FIFO or device in the folder is skipped, never waited on).

    hub = MemoryHub(keep_rounds=4)
    nodes = [MemoryTransport(hub, f"node-{i}") for i in range(4)]
    nodes[0].publish(0, encode(payload))
    nodes[1].fetch(0)   # [("node-0", b"...")]
"""

from __future__ import annotations

import logging
import os
import random
import stat
import threading
import uuid
from pathlib import Path
from typing import Protocol

from lmrl.swarm.transport import check_round

logger = logging.getLogger(__name__)

MAX_PEER_ID_CHARS = 128
MAX_FETCH_PEERS = 128
MAX_FETCH_BYTES = 64 << 20


def bounded(sizes: dict[str, int], max_peers: int, max_bytes: int) -> list[str]:
    """The peers of one fetch, sorted: all when they fit in ``max_peers`` entries and ``max_bytes`` bytes, else a
    random subset that does (random, so no peer id can sort its way in first)."""
    peers = sorted(sizes)
    if len(peers) <= max_peers and sum(sizes.values()) <= max_bytes:
        return peers
    random.SystemRandom().shuffle(peers)
    chosen, total = [], 0
    for peer in peers:
        if len(chosen) < max_peers and total + sizes[peer] <= max_bytes:
            chosen.append(peer)
            total += sizes[peer]
    return sorted(chosen)


class Hub(Protocol):
    """Round-keyed storage shared by the `MemoryTransport`s of one swarm."""

    def put(self, round: int, peer_id: str, data: bytes) -> None: ...

    def entries(self, round: int) -> dict[str, bytes]: ...


def _check_keep_rounds(keep_rounds: int) -> None:
    if isinstance(keep_rounds, bool) or not isinstance(keep_rounds, int) or keep_rounds < 1:
        raise ValueError(
            f"keep_rounds must be a positive int (how many recent rounds stay fetchable), got {keep_rounds!r}."
        )


class MemoryHub:
    """In-process hub: `{round: {peer_id: bytes}}` under a lock, keeping the last `keep_rounds` rounds."""

    def __init__(
        self, keep_rounds: int = 4, max_fetch_peers: int = MAX_FETCH_PEERS, max_fetch_bytes: int = MAX_FETCH_BYTES
    ) -> None:
        _check_keep_rounds(keep_rounds)
        self.keep_rounds = keep_rounds
        self.max_fetch_peers, self.max_fetch_bytes = max_fetch_peers, max_fetch_bytes
        self._rounds: dict[int, dict[str, bytes]] = {}
        self._lock = threading.Lock()

    def put(self, round: int, peer_id: str, data: bytes) -> None:
        """Store ``peer_id``'s entry of its round ``round`` and drop its own entries older than its window."""
        with self._lock:
            self._rounds.setdefault(round, {})[peer_id] = bytes(data)
            for old in [r for r in self._rounds if r <= round - self.keep_rounds]:
                self._rounds[old].pop(peer_id, None)
                if not self._rounds[old]:
                    del self._rounds[old]

    def entries(self, round: int) -> dict[str, bytes]:
        with self._lock:
            held = self._rounds.get(round, {})
            peers = bounded({p: len(d) for p, d in held.items()}, self.max_fetch_peers, self.max_fetch_bytes)
            return {p: held[p] for p in peers}

    def rounds(self) -> list[int]:
        """Rounds currently held, ascending."""
        with self._lock:
            return sorted(self._rounds)


class FileHub:
    """Directory hub for nodes in several processes: `<directory>/round-<r>/<hex peer id>.msgpack`.

    Reads take at most `max_entry_bytes + 1` bytes of a file, so a huge file
    costs no memory and still fails the receiver's size check."""

    _ROUND_PREFIX = "round-"
    _SUFFIX = ".msgpack"

    def __init__(
        self,
        directory: str | os.PathLike,
        keep_rounds: int = 4,
        max_entry_bytes: int = 4 << 20,
        max_fetch_peers: int = MAX_FETCH_PEERS,
        max_fetch_bytes: int = MAX_FETCH_BYTES,
    ) -> None:
        _check_keep_rounds(keep_rounds)
        if max_entry_bytes < 1:
            raise ValueError(f"max_entry_bytes must be >= 1, got {max_entry_bytes}.")
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.keep_rounds = keep_rounds
        self.max_entry_bytes = max_entry_bytes
        self.max_fetch_peers, self.max_fetch_bytes = max_fetch_peers, max_fetch_bytes

    def _round_dir(self, round: int) -> Path:
        return self.directory / f"{self._ROUND_PREFIX}{round:012d}"

    def rounds(self) -> list[int]:
        """Rounds currently on disk, ascending."""
        out = []
        for path in self.directory.iterdir():
            name = path.name
            if name.startswith(self._ROUND_PREFIX) and name[len(self._ROUND_PREFIX) :].isdigit():
                out.append(int(name[len(self._ROUND_PREFIX) :]))
        return sorted(out)

    def put(self, round: int, peer_id: str, data: bytes) -> None:
        if len(data) > self.max_entry_bytes:
            raise ValueError(
                f"payload of {len(data)} bytes exceeds this FileHub's max_entry_bytes={self.max_entry_bytes}; "
                "peers would read it truncated. Publish less per round or raise max_entry_bytes."
            )
        name = f"{peer_id.encode().hex()}{self._SUFFIX}"
        folder = self._round_dir(round)
        folder.mkdir(exist_ok=True)
        tmp = folder / f".tmp-{uuid.uuid4().hex}"
        try:
            tmp.write_bytes(data)
            os.replace(tmp, folder / name)  # atomic: readers see old or new
        except FileNotFoundError:  # the round's folder was removed meanwhile (it was empty): a lost publish
            logger.info("swarm: round %d vanished while %s published it", round, peer_id)
            tmp.unlink(missing_ok=True)
            return
        for old in self.rounds():
            if old <= round - self.keep_rounds:  # this node's own window; its own entries only
                (self._round_dir(old) / name).unlink(missing_ok=True)
                try:
                    self._round_dir(old).rmdir()  # only when empty: other peers' entries stay theirs
                except OSError:
                    pass

    def entries(self, round: int) -> dict[str, bytes]:
        out: dict[str, bytes] = {}
        try:
            names = os.listdir(self._round_dir(round))
        except FileNotFoundError:
            return out
        files: dict[str, str] = {}
        for name in names:
            if not name.endswith(self._SUFFIX):
                continue  # temp files of writers in progress, or foreign files
            try:
                files[bytes.fromhex(name[: -len(self._SUFFIX)]).decode()] = name
            except ValueError:  # not a hub file name
                continue
        sizes = {}
        for peer, name in files.items():  # what each read will cost (reads are capped at max_entry_bytes + 1)
            try:
                sizes[peer] = min(
                    os.stat(self._round_dir(round) / name, follow_symlinks=False).st_size, self.max_entry_bytes + 1
                )
            except OSError:  # pruned meanwhile
                continue
        for peer in bounded(sizes, self.max_fetch_peers, self.max_fetch_bytes):
            data = self._read(self._round_dir(round) / files[peer])
            if data is not None:
                out[peer] = data
        return out

    def _read(self, path: Path) -> bytes | None:
        """At most ``max_entry_bytes + 1`` bytes of a regular file; None for anything else (a FIFO, a device, a
        symlink) or a file pruned meanwhile. Opened non-blocking, so nothing in the folder can hang a fetch."""
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0))
        except OSError:
            return None
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return None
            with os.fdopen(fd, "rb", closefd=False) as f:
                return f.read(self.max_entry_bytes + 1)
        except OSError:
            return None
        finally:
            os.close(fd)


class MemoryTransport:
    """`Transport` over a `MemoryHub` or `FileHub`: `peer_id` is the name given here."""

    def __init__(self, hub: Hub, peer_id: str) -> None:
        if not isinstance(peer_id, str) or not peer_id or len(peer_id) > MAX_PEER_ID_CHARS:
            raise ValueError(
                f"peer_id must be a non-empty string of at most {MAX_PEER_ID_CHARS} characters, got {peer_id!r}; "
                "name each node uniquely, e.g. 'node-0'."
            )
        self.hub = hub
        self._peer_id = peer_id
        self._closed = False

    @property
    def peer_id(self) -> str:
        return self._peer_id

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError(f"MemoryTransport of {self._peer_id} is closed; create a new one to rejoin.")

    def publish(self, round: int, payload: bytes) -> None:
        self._check_open()
        check_round(round)
        if not isinstance(payload, (bytes, bytearray)):
            raise TypeError(f"publish() takes the encoded payload bytes, got {type(payload).__name__}; use encode().")
        self.hub.put(round, self._peer_id, bytes(payload))

    def fetch(self, round: int, exclude_self: bool = True) -> list[tuple[str, bytes]]:
        self._check_open()
        check_round(round)
        entries = self.hub.entries(round)
        return [(peer, data) for peer, data in sorted(entries.items()) if not (exclude_self and peer == self._peer_id)]

    def close(self) -> None:
        self._closed = True
