"""SAPO swarms: payload schema, transports (memory, hivemind), validated fetching.

`HivemindTransport` lives in `lmrl.swarm.hivemind_transport` and needs the
optional `hivemind` package; importing `lmrl.swarm` never imports it.
"""

from lmrl.swarm.memory import FileHub, MemoryHub, MemoryTransport
from lmrl.swarm.payload import (
    DEFAULT_LIMITS,
    REASONS,
    Payload,
    PayloadError,
    PayloadLimits,
    QuestionGroup,
    decode,
    encode,
)
from lmrl.swarm.transport import TRANSPORT_REASONS, SkipCounter, Transport, fetch_valid

__all__ = [
    "DEFAULT_LIMITS",
    "REASONS",
    "TRANSPORT_REASONS",
    "FileHub",
    "MemoryHub",
    "MemoryTransport",
    "Payload",
    "PayloadError",
    "PayloadLimits",
    "QuestionGroup",
    "SkipCounter",
    "Transport",
    "decode",
    "encode",
    "fetch_valid",
]
