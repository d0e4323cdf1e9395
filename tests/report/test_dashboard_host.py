"""The dashboard answers only requests addressed to it (Host 127.0.0.1/localhost/[::1] with its port): no DNS rebinding."""

import http.client

import pytest

from lmrl.report.dashboard import DashboardConfig, host_allowed, serve


def _status(port: int, host: str | None) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.putrequest("GET", "/api/runs", skip_host=True)
    if host is not None:
        conn.putheader("Host", host)
    conn.endheaders()
    status = conn.getresponse().status
    conn.close()
    return status


@pytest.mark.parametrize(
    "host, allowed",
    [
        ("127.0.0.1:{port}", True),
        ("localhost:{port}", True),
        ("[::1]:{port}", True),
        ("evil.example:{port}", False),
        ("127.0.0.1", False),
        ("127.0.0.1:1", False),
        (None, False),
    ],
)
def test_only_local_host_headers_are_served(tmp_path, host, allowed):
    server = serve(DashboardConfig(runs_dir=str(tmp_path), port=0))
    try:
        port = server.server_address[1]
        assert _status(port, None if host is None else host.format(port=port)) == (200 if allowed else 403)
    finally:
        server.shutdown()


def test_host_allowed_needs_the_port():
    assert host_allowed("localhost:8765", 8765) and not host_allowed("localhost:8766", 8765)
