"""The web-config file of Prometheus' own exporters (exporter-toolkit): TLS and basic auth.

Supported keys: `tls_server_config` {cert_file, key_file, client_auth_type, client_ca_file,
min_version, max_version} and `basic_auth_users` {name: bcrypt hash}. Anything else is refused at
start, by name, rather than silently ignored: a security setting that is not applied must not look
applied. Needs the `kvscope[web]` extra (PyYAML, bcrypt). Every kvscope HTTP server takes one (/metrics,
the OTLP receiver); it is core so that a collector may use it too. How it is applied: agent/http/server.py
(TLS per connection) and agent/http/basic_auth.py (constant-time checks with a cache).
"""

from __future__ import annotations

import os
import re
import ssl
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kvscope.agent.config.binding import ConfigError

if TYPE_CHECKING:
    from kvscope.agent.http.basic_auth import BasicAuth

_BCRYPT = re.compile(r"\$2[abxy]?\$[0-9]{2}\$[./A-Za-z0-9]{53}")
_TLS_KEYS = {"cert_file", "key_file", "client_auth_type", "client_ca_file", "min_version", "max_version"}
_CLIENT_AUTH = {
    "NoClientCert": ssl.CERT_NONE,
    "RequestClientCert": ssl.CERT_OPTIONAL,
    "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
    "RequireAndVerifyClientCert": ssl.CERT_REQUIRED,
}
_VERSIONS = {
    "TLS10": ssl.TLSVersion.TLSv1,
    "TLS11": ssl.TLSVersion.TLSv1_1,
    "TLS12": ssl.TLSVersion.TLSv1_2,
    "TLS13": ssl.TLSVersion.TLSv1_3,
}


@dataclass(frozen=True)
class WebConfig:
    """What a web-config file says: a TLS context for each connection, and users for basic auth."""

    tls: ssl.SSLContext | None = None
    auth: BasicAuth | None = None
    path: str = ""  # the file it was read from ("" = plain HTTP, no auth)

    def close(self) -> None:
        if self.auth is not None:
            self.auth.close()


def load_web_config(path: str) -> WebConfig:
    if not path:
        return WebConfig()
    try:
        import yaml
    except ImportError:
        raise ConfigError(f"{path}: a web config needs the kvscope[web] extra (PyYAML, bcrypt)") from None
    try:
        with open(path, encoding="utf-8") as fh:
            tree = yaml.safe_load(fh) or {}
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read web config: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from None
    if not isinstance(tree, dict):
        raise ConfigError(f"{path}: expected a mapping at the top level")
    for key in tree:
        if key not in ("tls_server_config", "basic_auth_users"):
            raise ConfigError(f"{path}: {key}: unsupported key (supported: basic_auth_users, tls_server_config)")
    tls = None
    if tree.get("tls_server_config"):
        tls = _tls_context(path, tree["tls_server_config"], os.path.dirname(path))
    users = tree.get("basic_auth_users") or {}
    if not isinstance(users, dict):
        raise ConfigError(f"{path}: basic_auth_users: expected a mapping of user: bcrypt-hash")
    if users:
        try:
            import bcrypt  # noqa: F401
        except ImportError:
            raise ConfigError(f"{path}: basic_auth_users needs the kvscope[web] extra (bcrypt)") from None
    hashes: dict[str, bytes] = {}
    for user, hashed in users.items():
        if not isinstance(hashed, str) or not _BCRYPT.fullmatch(hashed):
            raise ConfigError(f"{path}: basic_auth_users.{user}: expected a bcrypt hash ($2y$...)")
        if not 4 <= int(hashed.split("$")[2]) <= 31:
            raise ConfigError(f"{path}: basic_auth_users.{user}: bcrypt cost must be 4..31")
        hashes[str(user)] = hashed.encode()
    auth = None
    if hashes:
        from kvscope.agent.http.basic_auth import BasicAuth

        auth = BasicAuth(hashes)
    return WebConfig(tls, auth, path)


def _tls_context(path: str, section: Any, base: str) -> ssl.SSLContext:
    where = f"{path}: tls_server_config"
    if not isinstance(section, dict):
        raise ConfigError(f"{where}: expected a mapping")
    for key in section:
        if key not in _TLS_KEYS:
            raise ConfigError(f"{where}.{key}: unsupported key (supported: {', '.join(sorted(_TLS_KEYS))})")

    def resolve(name: str) -> str:
        return os.path.join(base, str(section[name]))

    if not section.get("cert_file") or not section.get("key_file"):
        raise ConfigError(f"{where}: cert_file and key_file are both required")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    # No TLS 1.3 session tickets: asyncio's TLS leaves them unsent after the handshake, and so held the first
    # response on each new connection ~40 ms (measured: 41-46 ms, 0.6 ms without). A scraper keeps its
    # connection alive, so resumption would save little.
    context.num_tickets = 0
    try:
        context.load_cert_chain(resolve("cert_file"), resolve("key_file"))
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"{where}: cannot load cert_file/key_file: {exc}") from None
    for key, attr in (("min_version", "minimum_version"), ("max_version", "maximum_version")):
        if key in section:
            if section[key] not in _VERSIONS:
                raise ConfigError(f"{where}.{key}: expected one of {', '.join(_VERSIONS)}")
            setattr(context, attr, _VERSIONS[section[key]])
    auth = section.get("client_auth_type", "NoClientCert")
    if auth not in _CLIENT_AUTH:
        raise ConfigError(f"{where}.client_auth_type: expected one of {', '.join(_CLIENT_AUTH)}")
    context.verify_mode = _CLIENT_AUTH[auth]
    if auth != "NoClientCert":
        if not section.get("client_ca_file"):
            raise ConfigError(f"{where}: client_auth_type {auth} needs client_ca_file")
        try:
            context.load_verify_locations(resolve("client_ca_file"))
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(f"{where}.client_ca_file: {exc}") from None
    return context
