"""The agent's log lines: logfmt (the default, as Prometheus' exporters write) or JSON, one line each.

`--log.level` and `--log.format` (or `agent.log_level` / `agent.log_format`) choose them. A line carries
the time (RFC 3339, UTC, milliseconds), the level, the logger and the message; an exception's traceback
is folded into the same line (logfmt: an `err` value with `\\n` escaped), so a log shipper never splits it.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Literal, TextIO

Format = Literal["logfmt", "json"]
_LEVELS = {"DEBUG": "debug", "INFO": "info", "WARNING": "warn", "ERROR": "error", "CRITICAL": "error"}


def _fields(record: logging.LogRecord) -> dict[str, str]:
    record.message = record.getMessage()  # what logging.Formatter.format sets, and handlers may read
    return {"ts": _timestamp(record), "level": _LEVELS.get(record.levelname, record.levelname.lower()),
            "logger": record.name, "msg": record.message}


def _timestamp(record: logging.LogRecord) -> str:
    seconds = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
    return f"{seconds}.{int(record.msecs):03d}Z"


def _logfmt_value(value: str) -> str:
    if value and not any(c in value for c in ' ="\\\n\t') and value.isprintable():
        return value
    escaped = value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\t", "\\t")
    return f'"{escaped}"'


class LogfmtFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        fields = _fields(record)
        if record.exc_info:
            fields["err"] = self.formatException(record.exc_info)
        return " ".join(f"{key}={_logfmt_value(value)}" for key, value in fields.items())


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line = _fields(record)
        if record.exc_info:
            line["err"] = self.formatException(record.exc_info)
        return json.dumps(line, ensure_ascii=False)


class _AgentHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """The agent's stderr handler: configure() finds it again instead of adding a second one. It writes to
    whatever sys.stderr is when a line is logged (as logging's last-resort handler does), never to a
    stream that was replaced since."""

    @property
    def stream(self) -> TextIO:
        return sys.stderr

    @stream.setter
    def stream(self, _value: object) -> None:
        pass


def configure(level: str = "info", fmt: Format = "logfmt") -> None:
    """Sets the root logger's level and the format of the agent's stderr handler (added once)."""
    root = logging.getLogger()
    handler = next((h for h in root.handlers if isinstance(h, _AgentHandler)), None)
    if handler is None:
        handler = _AgentHandler()
        root.addHandler(handler)
    handler.setFormatter(JsonFormatter() if fmt == "json" else LogfmtFormatter())
    root.setLevel(level.upper())
