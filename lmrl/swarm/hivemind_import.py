"""hivemind, imported without its side effect on torch; every lmrl module takes hivemind's names from here.

Importing hivemind switches torch's tensor sharing strategy to "file_system" for the whole process
(hivemind/utils/mpfuture.py), which its forked DHT process needs; lmrl runs no such process
(`HivemindTransport` runs `DHTNode` in a thread), so the strategy is restored right after.
"""

from __future__ import annotations

import torch.multiprocessing

# hivemind's import sets the strategy: read it before, restore it after.
_sharing_strategy = torch.multiprocessing.get_sharing_strategy()
from hivemind.dht.crypto import RSASignatureValidator  # noqa: E402
from hivemind.dht.node import DHTNode  # noqa: E402
from hivemind.dht.validation import DHTRecord  # noqa: E402
from hivemind.p2p import P2P  # noqa: E402
from hivemind.p2p.p2p_daemon_bindings.datastructures import PeerID  # noqa: E402
from hivemind.proto import crypto_pb2  # noqa: E402
from hivemind.utils.crypto import RSAPrivateKey, RSAPublicKey  # noqa: E402
from hivemind.utils.multiaddr import Multiaddr  # noqa: E402
from hivemind.utils.timed_storage import get_dht_time  # noqa: E402

torch.multiprocessing.set_sharing_strategy(_sharing_strategy)

__all__ = [
    "P2P",
    "DHTNode",
    "DHTRecord",
    "Multiaddr",
    "PeerID",
    "RSAPrivateKey",
    "RSAPublicKey",
    "RSASignatureValidator",
    "crypto_pb2",
    "get_dht_time",
]
