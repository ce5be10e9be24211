"""OpenAI-compatible HTTP endpoint and /metrics on one port, as vLLM serves them (so AIPerf can drive it).

Routes: POST /v1/completions and /v1/chat/completions (SSE when "stream": true, a usage chunk when
stream_options.include_usage, usage.prompt_tokens_details.cached_tokens), GET /v1/models, /health,
/metrics (prometheus text format, the engine's registry). Streams use HTTP/1.1 chunked encoding, so
connections stay alive between requests as with vLLM's uvicorn.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Iterator
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from kvscope.agent.http.messages import Request, Response
from kvscope.agent.http.server import HttpLimits, HttpServer
from kvscope.agent.tools.reference import tokenizer
from kvscope.agent.tools.reference.engine import Engine, EngineRequest

log = logging.getLogger("kvscope.reference.http")

# A streamed completion holds a worker thread while it waits for its next token: room for the
# concurrency a benchmark client drives (AIPerf's --concurrency), and prompts of a few hundred k tokens.
LIMITS = HttpLimits(max_connections=1024, workers=256)
MAX_BODY_BYTES = 64 * 1024 * 1024


class ReferenceServer:
    def __init__(self, engine: Engine, host: str = "127.0.0.1", port: int = 0) -> None:
        self.engine = engine
        self.httpd = HttpServer("reference", host, port, _App(engine), limits=LIMITS, max_body_bytes=MAX_BODY_BYTES,
                                server_header="kvscope-reference")

    @property
    def port(self) -> int:
        return self.httpd.port

    @property
    def url(self) -> str:
        return f"http://{self.httpd.address[0]}:{self.port}"

    def start(self) -> None:
        self.httpd.start()

    def stop(self) -> None:
        self.httpd.stop()


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


def _json(status: int, obj: Any) -> Response:
    return Response(status, json.dumps(obj).encode(), "application/json")


def _error(status: int, message: str) -> Response:
    return _json(status, {"error": {"message": message, "type": "BadRequestError", "code": status}})


class _App:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.model = engine.config.served_model_name

    def __call__(self, request: Request) -> Response:
        if request.method in ("GET", "HEAD"):
            return self._get(request.path)
        if request.method == "POST":
            return self._post(request)
        return _error(405, f"method {request.method} not allowed")

    def _get(self, path: str) -> Response:
        engine = self.engine
        if path == "/metrics":
            return Response(200, generate_latest(engine.registry), CONTENT_TYPE_LATEST)
        if path in ("/health", "/ping"):
            return Response(200, b"", "text/plain")
        if path == "/v1/models":
            return _json(200, {"object": "list", "data": [{
                "id": self.model, "object": "model", "created": int(time.time()), "owned_by": "kvscope",
                "root": self.model, "max_model_len": engine.max_prompt_tokens}]})
        return _error(404, f"no route {path}")

    def _post(self, request: Request) -> Response:
        engine = self.engine
        arrival = engine.clock()  # vLLM stamps arrival on receipt, before tokenisation
        path = request.path
        if path not in ("/v1/completions", "/v1/chat/completions"):
            return _error(404, f"no route {path}")
        chat = path == "/v1/chat/completions"
        try:
            body = json.loads(request.body or b"{}")
            if not isinstance(body, dict):
                raise ValueError("the body must be a JSON object")
            token_ids = _prompt_tokens(body, chat)
            max_tokens = _max_tokens(body)
            temperature = _number(body, "temperature", 0.0, 1e9)
            top_p = _number(body, "top_p", 1e-9, 1.0)
            req = engine.submit(token_ids, max_tokens, arrival=arrival, request_id=f"cmpl-{uuid.uuid4().hex}",
                                headers=dict(request.headers.items()), temperature=temperature, top_p=top_p)
        except (ValueError, TypeError) as exc:
            return _error(400, str(exc))
        if body.get("stream"):
            include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
            return Response(200, self._events(req, chat, include_usage), "text/event-stream",
                            [("Cache-Control", "no-cache")])
        return self._whole_response(req, chat)

    def _whole_response(self, req: EngineRequest, chat: bool) -> Response:
        pieces, reason = [], "length"
        for kind, value in _stream(req):
            if kind == "token":
                pieces.append(value)
            elif kind == "error":
                return _error(500, value)
            else:
                reason = value
        text = "".join(pieces)
        choice: dict[str, Any] = ({"index": 0, "message": {"role": "assistant", "content": text},
                                   "finish_reason": reason} if chat else
                                  {"index": 0, "text": text, "logprobs": None, "finish_reason": reason})
        return _json(200, {"id": req.request_id, "object": "chat.completion" if chat else "text_completion",
                           "created": int(time.time()), "model": self.model, "choices": [choice],
                           "usage": _usage(req, len(pieces))})

    def _events(self, req: EngineRequest, chat: bool, include_usage: bool) -> Iterator[bytes]:
        """The SSE events of a streamed completion; a client that goes away stops the stream, not the
        engine's request (it finishes regardless, as vLLM's would)."""
        created, obj = int(time.time()), "chat.completion.chunk" if chat else "text_completion"
        count = 0

        def event(choices: list[dict[str, Any]], usage: dict[str, Any] | None = None) -> bytes:
            chunk: dict[str, Any] = {"id": req.request_id, "object": obj, "created": created, "model": self.model,
                                     "choices": choices}
            if usage is not None:
                chunk["usage"] = usage
            return b"data: " + json.dumps(chunk).encode() + b"\n\n"

        for kind, value in _stream(req):
            if kind == "token":
                delta = {"content": value} if count else {"role": "assistant", "content": value}
                yield event([{"index": 0, "delta": delta, "finish_reason": None} if chat else
                             {"index": 0, "text": value, "logprobs": None, "finish_reason": None}])
                count += 1
            elif kind == "done":
                yield event([{"index": 0, "delta": {}, "finish_reason": value} if chat else
                             {"index": 0, "text": "", "logprobs": None, "finish_reason": value}])
                if include_usage:
                    yield event([], _usage(req, count))
            else:
                yield b"data: " + json.dumps({"error": {"message": value}}).encode() + b"\n\n"
        yield b"data: [DONE]\n\n"


def _max_tokens(body: dict[str, Any]) -> int | None:
    """max_completion_tokens (or the older max_tokens): absent or null for the engine's default, else an
    integer of at least 1, as vLLM requires."""
    key = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    value = body.get(key)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{key} must be an integer of at least 1, got {value!r}")
    return value


def _number(body: dict[str, Any], key: str, low: float, high: float) -> float | None:
    value = body.get(key)
    if value is None:
        return None
    if not isinstance(value, int | float) or isinstance(value, bool) or not low <= value <= high:
        raise ValueError(f"{key} must be a number in [{low:g}, {high:g}], got {value!r}")
    return float(value)


def _prompt_tokens(body: dict[str, Any], chat: bool) -> list[int]:
    if chat:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise ValueError("messages must be a non-empty list")
        for m in messages:
            if not isinstance(m, dict) or not isinstance(m.get("content", ""), str | list | None):
                raise ValueError(f"each message must be an object with a text or a list of parts as content, got "
                                 f"{str(m)[:80]!r}")
        return tokenizer.encode(tokenizer.render_chat(messages))
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]  # a batch of one prompt (a one-token prompt is a list of one id)
    if isinstance(prompt, str):
        return tokenizer.encode(prompt)
    if isinstance(prompt, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        for t in prompt:
            if not 0 <= t < tokenizer.VOCAB:
                raise ValueError(f"token id {t} is out of vocabulary (0..{tokenizer.VOCAB - 1})")
        return list(prompt)
    raise ValueError("prompt must be a string or a list of token ids")
