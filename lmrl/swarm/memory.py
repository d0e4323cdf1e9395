"""Swarm transports on one machine: nodes as threads of one process, or as processes sharing a folder.

- `MemoryHub`: a locked dict in this process. For simulations and tests with
  nodes as threads (or sequential calls).
- `FileHub`: a directory, one file per (round, peer), written atomically
  (temp file + `os.replace`), so several processes (or a shared filesystem) can
  swarm with no server. Chosen over a `multiprocessing.Manager` dict because
  there is no broker process whose death takes every node down, it survives node
  restarts, and it works for processes that were not started by one parent.

Both keep the last `keep_rounds` rounds: when a round r is published, rounds
<= r - keep_rounds are dropped, and a late publish for such a round is ignored.

    hub = MemoryHub(keep_rounds=4)
    nodes = [MemoryTransport(hub, f"node-{i}") for i in range(4)]
    nodes[0].publish(0, encode(payload))
    nodes[1].fetch(0)   # [("node-0", b"...")]
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
import uuid
from pathlib import Path
from typing import Protocol

from lmrl.swarm.transport import check_round

logger = logging.getLogger(__name__)

MAX_PEER_ID_CHARS = 128


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

    def __init__(self, keep_rounds: int = 4) -> None:
        _check_keep_rounds(keep_rounds)
        self.keep_rounds = keep_rounds
        self._rounds: dict[int, dict[str, bytes]] = {}
        self._newest = -1
        self._lock = threading.Lock()

    def put(self, round: int, peer_id: str, data: bytes) -> None:
        with self._lock:
            self._newest = max(self._newest, round)
            oldest_kept = self._newest - self.keep_rounds + 1
            if round < oldest_kept:
                logger.info("swarm: ignored publish of %s for expired round %d", peer_id, round)
                return
            self._rounds.setdefault(round, {})[peer_id] = bytes(data)
            for old in [r for r in self._rounds if r < oldest_kept]:
                del self._rounds[old]

    def entries(self, round: int) -> dict[str, bytes]:
        with self._lock:
            return dict(self._rounds.get(round, {}))

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

    def __init__(self, directory: str | os.PathLike, keep_rounds: int = 4, max_entry_bytes: int = 4 << 20) -> None:
        _check_keep_rounds(keep_rounds)
        if max_entry_bytes < 1:
            raise ValueError(f"max_entry_bytes must be >= 1, got {max_entry_bytes}.")
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.keep_rounds = keep_rounds
        self.max_entry_bytes = max_entry_bytes

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
        newest = max([round, *self.rounds()])
        oldest_kept = newest - self.keep_rounds + 1
        if round < oldest_kept:
            logger.info("swarm: ignored publish of %s for expired round %d", peer_id, round)
            return
        folder = self._round_dir(round)
        folder.mkdir(exist_ok=True)
        tmp = folder / f".tmp-{uuid.uuid4().hex}"
        try:
            tmp.write_bytes(data)
            os.replace(tmp, folder / f"{peer_id.encode().hex()}{self._SUFFIX}")  # atomic: readers see old or new
        except FileNotFoundError:  # another node pruned this round meanwhile: it expired, like above
            logger.info("swarm: round %d expired while %s published it", round, peer_id)
            tmp.unlink(missing_ok=True)
            return
        for old in self.rounds():
            if old < oldest_kept:
                shutil.rmtree(self._round_dir(old), ignore_errors=True)  # concurrent pruners are fine

    def entries(self, round: int) -> dict[str, bytes]:
        out: dict[str, bytes] = {}
        try:
            names = os.listdir(self._round_dir(round))
        except FileNotFoundError:
            return out
        for name in names:
            if not name.endswith(self._SUFFIX):
                continue  # temp files of writers in progress, or foreign files
            try:
                peer_id = bytes.fromhex(name[: -len(self._SUFFIX)]).decode()
                with open(self._round_dir(round) / name, "rb") as f:
                    out[peer_id] = f.read(self.max_entry_bytes + 1)
            except (ValueError, OSError):  # not a hub file name, or pruned meanwhile
                continue
        return out


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
