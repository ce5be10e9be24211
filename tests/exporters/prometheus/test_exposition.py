"""The exposition: the fast renderer equals prometheus-client's, and the HTTP endpoint behaves."""

from __future__ import annotations

import base64
import gzip
import http.client
import ssl
import subprocess
from pathlib import Path

import bcrypt
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics
from prometheus_client.openmetrics.parser import text_string_to_metric_families as openmetrics_families
from prometheus_client.parser import text_string_to_metric_families

from kvscope.agent.config.settings import ConfigError
from kvscope.agent.core.catalogue import Catalogue
from kvscope.agent.core.store import Store
from kvscope.agent.http.webconfig import load_web_config
from kvscope.exporters.prometheus.exposition import StoreCollector, TextRenderer
from kvscope.exporters.prometheus.server import MetricsServer, wants_openmetrics
from testkit.stores import SPECS, filled_store


def test_fast_renderer_is_byte_identical_to_prometheus_client() -> None:
    store = filled_store()
    registry = CollectorRegistry(auto_describe=False)
    registry.register(StoreCollector(store))  # type: ignore[arg-type]
    expected = generate_latest(registry)
    renderer = TextRenderer(store)
    assert renderer.render() == expected
    assert renderer.render() == expected  # second render uses the caches
    names = {f.name for f in text_string_to_metric_families(expected.decode())}
    assert {"kvscope_x_bytes", "kvscope_y_blocks", "kvscope_z_seconds"} <= names


def test_fast_openmetrics_is_byte_identical_to_prometheus_client() -> None:
    store = filled_store()
    registry = CollectorRegistry(auto_describe=False)
    registry.register(StoreCollector(store))  # type: ignore[arg-type]
    expected = generate_openmetrics(registry)
    renderer = TextRenderer(store)
    renderer.render()  # the sample cache the text format made serves OpenMetrics too
    assert renderer.render_openmetrics() == expected
    assert renderer.render_openmetrics() == expected
    families = {f.name: f for f in openmetrics_families(expected.decode())}
    assert families["kvscope_x_bytes"].type == "counter" and families["kvscope_x_bytes"].documentation.startswith(
        "Bytes with a \\ backslash\nand")
    assert TextRenderer(Store(Catalogue(SPECS))).render_openmetrics() == b"# EOF\n"


@pytest.fixture
def server() -> MetricsServer:
    srv = MetricsServer(filled_store(), "127.0.0.1", 0)
    srv.start()
    yield srv
    srv.stop()


def get(port: int, path: str = "/metrics", headers: dict[str, str] | None = None,
        context: ssl.SSLContext | None = None) -> tuple[int, dict[str, str], bytes]:
    conn: http.client.HTTPConnection
    if context is None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    else:
        conn = http.client.HTTPSConnection("127.0.0.1", port, timeout=10, context=context)
    conn.request("GET", path, headers=headers or {})
    resp = conn.getresponse()
    return resp.status, dict(resp.getheaders()), resp.read()


def test_http_plain_gzip_openmetrics_and_keepalive(server: MetricsServer) -> None:
    status, headers, body = get(server.port)
    assert status == 200 and headers["Content-Type"].startswith("text/plain; version=0.0.4")
    assert body == server.renderer.render()
    status, headers, zipped = get(server.port, headers={"Accept-Encoding": "gzip"})
    assert headers.get("Content-Encoding") == "gzip" and gzip.decompress(zipped) == body
    status, headers, om = get(server.port, headers={"Accept": "application/openmetrics-text; version=1.0.0"})
    assert headers["Content-Type"].startswith("application/openmetrics-text")
    assert om.endswith(b"# EOF\n")
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    for _ in range(3):  # one connection, several scrapes
        conn.request("GET", "/metrics")
        assert conn.getresponse().read() == body
    assert get(server.port, "/nope")[0] == 404


PROMETHEUS_2_42_ACCEPT = ("application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;"
                          "q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1")


@pytest.mark.parametrize(("accept", "openmetrics"), [
    (PROMETHEUS_2_42_ACCEPT, True),
    ("application/openmetrics-text; version=1.0.0", True),
    ("application/openmetrics-text", True),
    ("", False),
    ("*/*", False),
    ("text/plain", False),
    ("text/plain;version=0.0.4;q=1,application/openmetrics-text;version=1.0.0;q=0.5", False),
    ("application/openmetrics-text;version=1.0.0;q=0", False),
    ("application/openmetrics-text;version=2.0.0", False),  # a version we do not write
    ("application/openmetrics-text;version=2.0.0,text/plain;q=0.2", False),
    ("APPLICATION/OpenMetrics-Text; Version=\"1.0.0\"; q=0.9, text/plain; q=0.8", True),
    ("application/openmetrics-text;q=nonsense", False),
])
def test_accept_negotiation_follows_the_clients_preference(accept: str, openmetrics: bool) -> None:
    assert wants_openmetrics(accept) is openmetrics


def test_prometheus_accept_header_gets_openmetrics_equal_to_prometheus_client(server: MetricsServer) -> None:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(StoreCollector(server.store))  # type: ignore[arg-type]
    status, headers, body = get(server.port, headers={"Accept": PROMETHEUS_2_42_ACCEPT,
                                                      "Accept-Encoding": "gzip"})
    assert status == 200 and headers["Content-Type"] == "application/openmetrics-text; version=1.0.0; charset=utf-8"
    assert gzip.decompress(body) == generate_openmetrics(registry)


def test_basic_auth_from_web_config(tmp_path: Path) -> None:
    hashed = bcrypt.hashpw(b"s3cret", bcrypt.gensalt(rounds=4)).decode()
    cfg = tmp_path / "web.yml"
    cfg.write_text(f"basic_auth_users:\n  prom: '{hashed}'\n")
    srv = MetricsServer(filled_store(), "127.0.0.1", 0, load_web_config(str(cfg)))
    srv.start()
    try:
        assert get(srv.port)[0] == 401
        bad = base64.b64encode(b"prom:wrong").decode()
        assert get(srv.port, headers={"Authorization": f"Basic {bad}"})[0] == 401
        good = base64.b64encode(b"prom:s3cret").decode()
        assert get(srv.port, headers={"Authorization": f"Basic {good}"})[0] == 200
    finally:
        srv.stop()


def test_tls_from_web_config(tmp_path: Path) -> None:
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=127.0.0.1", "-keyout", str(tmp_path / "key.pem"),
                    "-out", str(tmp_path / "cert.pem")], check=True, capture_output=True)
    cfg = tmp_path / "web.yml"
    cfg.write_text("tls_server_config:\n  cert_file: cert.pem\n  key_file: key.pem\n")
    srv = MetricsServer(filled_store(), "127.0.0.1", 0, load_web_config(str(cfg)))
    srv.start()
    try:
        context = ssl.create_default_context(cafile=str(tmp_path / "cert.pem"))
        context.check_hostname = False
        status, _, body = get(srv.port, context=context)
        assert status == 200 and b"kvscope_y_blocks 1.2345678e+07" in body
    finally:
        srv.stop()


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("tls_server_config:\n  cert_file: a.pem\n", "cert_file and key_file are both required"),
        ("tls_server_config:\n  cert: a.pem\n", "tls_server_config.cert: unsupported key"),
        ("http_server_config:\n  http2: true\n", "http_server_config: unsupported key"),
        ("basic_auth_users:\n  prom: plaintext\n", "basic_auth_users.prom: expected a bcrypt hash"),
        ("basic_auth_users:\n  prom: $2y$99$" + "a" * 53 + "\n", "basic_auth_users.prom: bcrypt cost must be 4..31"),
        ("tls_server_config:\n  cert_file: no.pem\n  key_file: no.pem\n", "cannot load cert_file/key_file"),
    ],
)
def test_web_config_mistakes_are_refused_by_name(tmp_path: Path, text: str, needle: str) -> None:
    cfg = tmp_path / "web.yml"
    cfg.write_text(text)
    with pytest.raises(ConfigError, match=needle.replace(".", r"\.")):
        load_web_config(str(cfg))
