"""The HTTP server every kvscope endpoint runs on (/metrics, OTLP receiver, the reference engine)."""

from __future__ import annotations

import logging
import sys
from http.server import ThreadingHTTPServer

log = logging.getLogger("kvscope.http")


class QuietHTTPServer(ThreadingHTTPServer):
    """A threading HTTP server that logs a client hanging up mid-request instead of printing a traceback."""

    daemon_threads = True

    def handle_error(self, request: object, client_address: object) -> None:
        exc = sys.exc_info()[1]
        if isinstance(exc, ConnectionError | TimeoutError):
            log.debug("client %s went away: %r", client_address, exc)
        else:
            log.warning("request from %s failed", client_address, exc_info=True)
