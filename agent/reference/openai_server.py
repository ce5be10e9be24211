"""OpenAI-compatible HTTP endpoint and /metrics on one port, as vLLM serves them (so AIPerf can drive it).

Routes: POST /v1/completions and /v1/chat/completions (SSE when "stream": true, a usage chunk when
stream_options.include_usage, usage.prompt_tokens_details.cached_tokens), GET /v1/models, /health,
/metrics (prometheus text format, the engine's registry). Streams use HTTP/1.1 chunked encoding, so
connections stay alive between requests as with vLLM's uvicorn.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from kvscope.agent.http_server import QuietHTTPServer
from kvscope.agent.reference import tokenizer
from kvscope.agent.reference.engine import Engine, EngineRequest

log = logging.getLogger("kvscope.reference.http")


class ReferenceServer:
    def __init__(self, engine: Engine, host: str = "127.0.0.1", port: int = 0) -> None:
        self.engine = engine
        self.httpd = QuietHTTPServer((host, port), _handler(engine))
        self._thread = threading.Thread(target=self.httpd.serve_forever, name="reference-http", daemon=True)

    @property
    def port(self) -> int:
        return int(self.httpd.server_address[1])

    @property
    def url(self) -> str:
        host = self.httpd.server_address[0]
        return f"http://{host if isinstance(host, str) else host.decode()}:{self.port}"

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def _usage(req: EngineRequest, completion_tokens: int) -> dict[str, Any]:
    prompt = req.truth.prompt_tokens
    return {"prompt_tokens": prompt, "completion_tokens": completion_tokens,
            "total_tokens": prompt + completion_tokens,
            "prompt_tokens_details": {"cached_tokens": prompt - req.truth.computed_tokens}}


def _stream(req: EngineRequest) -> Iterator[tuple[str, str]]:
    while True:
        kind, value = req.out.get()
        yield kind, value
        if kind != "token":
            return


def _handler(engine: Engine) -> type[BaseHTTPRequestHandler]:
    model = engine.config.served_model_name

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        server_version = "kvscope-reference"
        disable_nagle_algorithm = True  # each SSE chunk is a small write: Nagle + delayed ACK would hold it ~40 ms

        def log_message(self, format: str, *args: object) -> None:
            log.debug("%s " + format, self.address_string(), *args)

        def _send(self, status: int, body: bytes, content_type: str = "application/json") -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _json(self, status: int, obj: Any) -> None:
            self._send(status, json.dumps(obj).encode())

        def _error(self, status: int, message: str) -> None:
            self._json(status, {"error": {"message": message, "type": "BadRequestError", "code": status}})

        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path == "/metrics":
                self._send(200, generate_latest(engine.registry), CONTENT_TYPE_LATEST)
            elif path in ("/health", "/ping"):
                self._send(200, b"", "text/plain")
            elif path == "/v1/models":
                self._json(200, {"object": "list", "data": [{
                    "id": model, "object": "model", "created": int(time.time()), "owned_by": "kvscope",
                    "root": model, "max_model_len": engine.max_prompt_tokens}]})
            else:
                self._error(404, f"no route {path}")

        def do_POST(self) -> None:
            arrival = engine.clock()  # vLLM stamps arrival on receipt, before tokenisation
            path = self.path.split("?", 1)[0]
            if path not in ("/v1/completions", "/v1/chat/completions"):
                self._error(404, f"no route {path}")
                return
            chat = path == "/v1/chat/completions"
            try:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
                if not isinstance(body, dict):
                    raise ValueError("the body must be a JSON object")
                token_ids = _prompt_tokens(body, chat)
                max_tokens = int(body.get("max_completion_tokens") or body.get("max_tokens") or 0) or None
                req = engine.submit(token_ids, max_tokens, arrival=arrival, request_id=f"cmpl-{uuid.uuid4().hex}",
                                    headers=dict(self.headers.items()), temperature=body.get("temperature"),
                                    top_p=body.get("top_p"))
            except (ValueError, TypeError) as exc:
                self._error(400, str(exc))
                return
            if body.get("stream"):
                include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
                self._stream_response(req, chat, include_usage)
            else:
                self._whole_response(req, chat)

        def _whole_response(self, req: EngineRequest, chat: bool) -> None:
            pieces, reason = [], "length"
            for kind, value in _stream(req):
                if kind == "token":
                    pieces.append(value)
                elif kind == "error":
                    self._error(500, value)
                    return
                else:
                    reason = value
            text = "".join(pieces)
            choice: dict[str, Any] = ({"index": 0, "message": {"role": "assistant", "content": text},
                                       "finish_reason": reason} if chat else
                                      {"index": 0, "text": text, "logprobs": None, "finish_reason": reason})
            self._json(200, {"id": req.request_id, "object": "chat.completion" if chat else "text_completion",
                             "created": int(time.time()), "model": model, "choices": [choice],
                             "usage": _usage(req, len(pieces))})

        def _stream_response(self, req: EngineRequest, chat: bool, include_usage: bool) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Cache-Control", "no-cache")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            created, obj = int(time.time()), "chat.completion.chunk" if chat else "text_completion"
            count = 0

            def event(choices: list[dict[str, Any]], usage: dict[str, Any] | None = None) -> None:
                chunk: dict[str, Any] = {"id": req.request_id, "object": obj, "created": created, "model": model,
                                         "choices": choices}
                if usage is not None:
                    chunk["usage"] = usage
                self._chunk(b"data: " + json.dumps(chunk).encode() + b"\n\n")

            try:
                for kind, value in _stream(req):
                    if kind == "token":
                        delta = {"content": value} if count else {"role": "assistant", "content": value}
                        event([{"index": 0, "delta": delta, "finish_reason": None} if chat else
                               {"index": 0, "text": value, "logprobs": None, "finish_reason": None}])
                        count += 1
                    elif kind == "done":
                        event([{"index": 0, "delta": {}, "finish_reason": value} if chat else
                               {"index": 0, "text": "", "logprobs": None, "finish_reason": value}])
                        if include_usage:
                            event([], _usage(req, count))
                    else:
                        self._chunk(b"data: " + json.dumps({"error": {"message": value}}).encode() + b"\n\n")
                self._chunk(b"data: [DONE]\n\n")
                self._chunk(b"")
            except (BrokenPipeError, ConnectionResetError):
                log.debug("client of %s went away", req.request_id)  # the engine finishes it regardless

        def _chunk(self, data: bytes) -> None:
            self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            self.wfile.flush()

    return Handler


def _prompt_tokens(body: dict[str, Any], chat: bool) -> list[int]:
    if chat:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise ValueError("messages must be a non-empty list")
        return tokenizer.encode(tokenizer.render_chat(messages))
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1:
        prompt = prompt[0]
    if isinstance(prompt, str):
        return tokenizer.encode(prompt)
    if isinstance(prompt, list) and all(isinstance(t, int) for t in prompt):
        return list(prompt)
    raise ValueError("prompt must be a string or a list of token ids")
