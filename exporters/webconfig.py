"""The web-config file of Prometheus' own exporters (exporter-toolkit): TLS and basic auth.

Supported keys: `tls_server_config` {cert_file, key_file, client_auth_type, client_ca_file,
min_version, max_version} and `basic_auth_users` {name: bcrypt hash}. Anything else is refused at
start, by name, rather than silently ignored: a security setting that is not applied must not look
applied. Needs the `kvscope[web]` extra (PyYAML, bcrypt).
"""

from __future__ import annotations

import base64
import hashlib
import os
import ssl
import threading
from dataclasses import dataclass, field
from typing import Any

from kvscope.agent.config import ConfigError

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


@dataclass
class WebConfig:
    tls: ssl.SSLContext | None = None
    users: dict[str, bytes] = field(default_factory=dict)
    _verified: set[bytes] = field(default_factory=set)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def authorised(self, header: str | None) -> bool:
        """Checks an Authorization header; bcrypt is slow, so a verified pair is remembered."""
        if not self.users:
            return True
        if not header or not header.startswith("Basic "):
            return False
        try:
            user, _, password = base64.b64decode(header[6:], validate=True).decode().partition(":")
        except (ValueError, UnicodeDecodeError):
            return False
        hashed = self.users.get(user)
        if hashed is None:
            return False
        key = hashlib.sha256(f"{user}\0{password}".encode()).digest()
        with self._lock:
            if key in self._verified:
                return True
        import bcrypt

        if not bcrypt.checkpw(password.encode(), hashed):
            return False
        with self._lock:
            self._verified.add(key)
        return True


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
    config = WebConfig()
    if tree.get("tls_server_config"):
        config.tls = _tls_context(path, tree["tls_server_config"], os.path.dirname(path))
    users = tree.get("basic_auth_users") or {}
    if not isinstance(users, dict):
        raise ConfigError(f"{path}: basic_auth_users: expected a mapping of user: bcrypt-hash")
    if users:
        try:
            import bcrypt  # noqa: F401
        except ImportError:
            raise ConfigError(f"{path}: basic_auth_users needs the kvscope[web] extra (bcrypt)") from None
    for user, hashed in users.items():
        if not isinstance(hashed, str) or not hashed.startswith("$2"):
            raise ConfigError(f"{path}: basic_auth_users.{user}: expected a bcrypt hash ($2y$...)")
        config.users[str(user)] = hashed.encode()
    return config


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
