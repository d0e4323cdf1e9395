"""Who signed a hivemind DHT record: libp2p identity files, peer ids of RSA keys, and the record validator.

Every lmrl record carries hivemind's ``[owner:<RSA public key>]`` marker in its subkey and is signed
with the node's libp2p identity key, so a sender's peer id is derived from the key that signed it.
`SwarmRecordValidator` refuses unsigned records, values that are not bytes of bounded size, expirations
further than `MAX_EXPIRATION_S` ahead, and an owner's records beyond `OWNER_BUDGET_BYTES` alive at once.
"""

from __future__ import annotations

import hashlib
import logging
import os
from pathlib import Path
from typing import Any

import msgpack
from cryptography.hazmat.primitives import serialization

from lmrl.swarm.hivemind_import import (
    P2P,
    DHTRecord,
    PeerID,
    RSAPrivateKey,
    RSAPublicKey,
    RSASignatureValidator,
    crypto_pb2,
    get_dht_time,
)
from lmrl.swarm.hivemind_options import MAX_EXPIRATION_S, MAX_VALUE_BYTES, OWNER_BUDGET_BYTES

logger = logging.getLogger(__name__)


def load_or_create_identity(path: str | os.PathLike) -> RSAPrivateKey:
    """The RSA key in libp2p's protobuf key file at `path`, generating the file (mode 0400) if absent."""
    path = Path(path)
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        P2P.generate_identity(str(path))
        logger.info("swarm: generated a new identity in %s", path)
    try:
        proto = crypto_pb2.PrivateKey.FromString(path.read_bytes())
        if proto.key_type != crypto_pb2.KeyType.RSA:
            raise ValueError(f"key type {crypto_pb2.KeyType.Name(proto.key_type)}, not RSA")
        key = serialization.load_der_private_key(proto.data, password=None)
    except Exception as err:  # noqa: BLE001 - protobuf, cryptography and our own errors alike
        raise ValueError(
            f"The identity file {path} is not a libp2p RSA private key ({err}). Point identity_path to the "
            "file this node used before, or delete it to start with a new identity (and a new peer id)."
        ) from None
    private = RSAPrivateKey.__new__(RSAPrivateKey)  # wrap an existing key (its __init__ generates a new one)
    private._private_key = key
    return private


def peer_id_of(public_key: RSAPublicKey) -> str:
    """The libp2p peer id (base58) of an RSA public key: multihash(sha256(protobuf PublicKey(DER SPKI))),
    as in the libp2p peer-id spec and hivemind's `PeerID.from_identity`."""
    der = public_key._public_key.public_bytes(
        encoding=serialization.Encoding.DER, format=serialization.PublicFormat.SubjectPublicKeyInfo
    )
    encoded = crypto_pb2.PublicKey(key_type=crypto_pb2.RSA, data=der).SerializeToString()
    return PeerID(b"\x12\x20" + hashlib.sha256(encoded).digest()).to_base58()  # 0x12 = sha2-256, 0x20 = 32 bytes


def owner_peer_id(subkey: Any) -> str | None:
    """The peer id of the single `[owner:...]` public key in a subkey, or None if there is none / it is invalid."""
    if not isinstance(subkey, bytes):
        return None
    keys = RSASignatureValidator._PUBLIC_KEY_RE.findall(subkey)
    if len(keys) != 1:
        return None
    try:
        return peer_id_of(RSAPublicKey.from_bytes(keys[0]))
    except Exception:  # noqa: BLE001 - a malformed key is just not an owner
        return None


class SwarmRecordValidator(RSASignatureValidator):
    """Accepts only records signed by their owner whose value is msgpack `bytes` of <= MAX_VALUE_BYTES, that expire
    within `MAX_EXPIRATION_S`, and that keep their owner within `OWNER_BUDGET_BYTES` of unexpired records.

    hivemind applies it when storing for others and to every lookup result, so an
    unsigned, oversized, near-eternal or over-budget record never reaches `fetch` or fills this node's memory."""

    def __init__(self, private_key: RSAPrivateKey | None = None, budget_bytes: int = OWNER_BUDGET_BYTES) -> None:
        super().__init__(private_key)
        self.budget_bytes = budget_bytes
        self._held: dict[bytes, dict[tuple[bytes, bytes], tuple[float, int]]] = {}  # owner -> record -> (exp, size)

    def validate(self, record: DHTRecord) -> bool:
        owners = RSASignatureValidator._PUBLIC_KEY_RE.findall(record.subkey)
        if len(owners) != 1:
            return False  # unsigned (or regular, subkey-less) records have no authenticated sender
        now = get_dht_time()
        if record.expiration_time > now + MAX_EXPIRATION_S:
            return False
        if not super().validate(record) or not self._value_ok(record):
            return False
        return self._within_budget(owners[0], record, now)

    def _within_budget(self, owner: bytes, record: DHTRecord, now: float) -> bool:
        """Count the record against its owner's budget (a re-store of the same key and subkey replaces it)."""
        held = self._held.setdefault(owner, {})
        for name in [n for n, (expiration, _) in held.items() if expiration < now]:
            del held[name]
        name, size = (record.key, record.subkey), len(record.value)
        if sum(s for n, (_, s) in held.items() if n != name) + size > self.budget_bytes:
            return False
        held[name] = (max(record.expiration_time, held.get(name, (0.0, 0))[0]), size)
        return True

    def _value_ok(self, record: DHTRecord) -> bool:
        stripped = self.strip_value(record)
        if len(stripped) > MAX_VALUE_BYTES + 16:  # msgpack bin header: at most 5 bytes
            return False
        try:
            value = msgpack.unpackb(stripped, raw=False)
        except Exception:  # noqa: BLE001 - any undecodable value is invalid
            return False
        return isinstance(value, bytes) and len(value) <= MAX_VALUE_BYTES
