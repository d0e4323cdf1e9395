"""What `lmrl vllm-serve` (`vllm_server.py`) and its client (`vllm_client.py`) agree on over HTTP, importable by both
without torch or a circle."""

SESSION_HEADER = "X-LMRL-Session"
"""The owner's token (from ``/init``), on every request after it: a second trainer is refused."""
