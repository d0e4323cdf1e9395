"""What `lmrl vllm-serve` (`server.py`) and its client (`client.py`) agree on over HTTP, importable by both
without torch or a circle."""

from lmrl.config_base import ConfigError

SESSION_HEADER = "X-LMRL-Session"
"""The owner's token (from ``/init``), on every request after it: a second trainer is refused."""


def parse_server(value: str, key: str = "vllm_server") -> str:
    """'host:port' or 'http://host:port' -> 'http://host:port' (ConfigError naming `key` otherwise)."""
    url = value if value.startswith(("http://", "https://")) else f"http://{value}"
    host, _, port = url.split("://", 1)[1].rstrip("/").rpartition(":")
    if not host or not port.isdigit():
        raise ConfigError(
            f"{key}={value!r}: give host:port (e.g. 127.0.0.1:8000) of a running "
            "`lmrl vllm-serve port=8000`, or auto to start one, or null for vLLM in this process."
        )
    return url.rstrip("/")
