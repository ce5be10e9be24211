"""A live NVIDIA Dynamo for the e2e tests (e2e/test_dynamo_*.py): a frontend with the KV router and two mocker
workers (Dynamo's own simulated engine: it schedules, keeps a prefix cache in blocks and publishes KV events),
file discovery, no GPU, no etcd or NATS (shared facts: dynamo-cpu.md), with `kvscope run` beside it.

Each worker serves its /metrics on a system port (DYN_SYSTEM_ENABLED) and publishes its KV events in vLLM's
wire format on a ZMQ port of its own: worker r on `kv_events_port + r` (its replay ROUTER on `replay_port + r`),
so one KV-event collector with data_parallel_size 2 subscribes to both (worker r is rank r). Processes write
their logs into the folder."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from testkit.live_vllm import first_chunk_seconds
from testkit.processes import free_port, stop, wait_http

MODEL = "tiny"  # the served model name
WORKERS = 2
BLOCK_TOKENS = 32  # the mocker's block size
G1_BLOCKS = 64  # each worker's G1 (--num-gpu-blocks-override)
KV_BYTES_PER_TOKEN = 512  # e2e/tiny_llama.py's geometry, told to the mocker


@dataclass(frozen=True)
class Stack:
    frontend_url: str  # http://127.0.0.1:PORT (OpenAI API and /metrics)
    worker_urls: tuple[str, ...]  # each worker's system port
    kv_events_port: int  # worker r publishes on this port + r
    replay_port: int  # and answers replay requests on this port + r
    folder: Path
    model: str = MODEL


@dataclass(frozen=True)
class Sidecar:
    url: str  # kvscope's own http://127.0.0.1:PORT
    log: Path


def consecutive_free_ports(count: int) -> int:
    """The first of `count` consecutive ports, free now (below the ephemeral range, as free_port's are)."""
    while True:
        first = free_port()
        try:
            with ExitStack() as stack:
                for offset in range(1, count):
                    s = stack.enter_context(socket.socket())
                    s.bind(("127.0.0.1", first + offset))
        except OSError:
            continue
        return first


def _start(command: Sequence[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(list(command), env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT)


@contextmanager
def dynamo(venv: Path, model: Path, folder: Path) -> Iterator[Stack]:
    """The frontend and two mocker workers, each on free ports; yields once the frontend lists the model and
    every worker's system port answers."""
    python = str(venv / "bin" / "python")
    http = free_port()
    systems = [free_port() for _ in range(WORKERS)]
    kv_events = consecutive_free_ports(2 * WORKERS)  # the KV-event ports, then the replay ports
    replay = kv_events + WORKERS
    env = {**os.environ, "DYN_FILE_KV": str(folder / "discovery"), "HOME": str(folder)}  # HOME: its model cache
    processes = [_start([python, "-m", "dynamo.frontend", "--discovery-backend", "file", "--http-host", "127.0.0.1",
                         "--http-port", str(http), "--router-mode", "kv"], env, folder / "frontend.log")]
    for rank, system in enumerate(systems):
        processes.append(_start(
            [python, "-m", "dynamo.mocker", "--model-path", str(model), "--model-name", MODEL,
             "--discovery-backend", "file", "--num-gpu-blocks-override", str(G1_BLOCKS),
             "--block-size", str(BLOCK_TOKENS), "--kv-bytes-per-token", str(KV_BYTES_PER_TOKEN),
             "--zmq-kv-events-ports", str(kv_events + rank), "--zmq-replay-ports", str(replay + rank)],
            {**env, "DYN_SYSTEM_ENABLED": "true", "DYN_SYSTEM_PORT": str(system)}, folder / f"worker-{rank}.log"))
    stack = Stack(f"http://127.0.0.1:{http}", tuple(f"http://127.0.0.1:{p}" for p in systems), kv_events, replay,
                  folder)
    try:
        for process, url, log in [(processes[0], stack.frontend_url + "/v1/models", folder / "frontend.log"),
                                  *((p, f"{u}/metrics", folder / f"worker-{r}.log")
                                    for r, (p, u) in enumerate(zip(processes[1:], stack.worker_urls, strict=True)))]:
            wait_http(url, process, log, 120)
        deadline = time.monotonic() + 120
        while MODEL not in models(stack):
            log = (folder / "frontend.log").read_text()[-3000:]
            assert time.monotonic() < deadline, f"the frontend never listed {MODEL}; its log ends:\n{log}"
            time.sleep(0.5)
        yield stack
    finally:
        for process in reversed(processes):
            stop(process, grace=20)


def models(stack: Stack) -> list[str]:
    with urllib.request.urlopen(stack.frontend_url + "/v1/models", timeout=5) as response:
        return [m["id"] for m in json.load(response)["data"]]


@contextmanager
def kvscope(config: str, folder: Path, name: str) -> Iterator[Sidecar]:
    """`kvscope run` with `config` (TOML; "{listen}" is replaced by its own address), its log in the folder."""
    port = free_port()
    path = folder / f"{name}.toml"
    path.write_text(config.replace("{listen}", f"127.0.0.1:{port}"))
    log = folder / f"{name}.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("KVSCOPE_")}
    process = _start([str(Path(sys.executable).parent / "kvscope"), "run", "--config", str(path)], env, log)
    try:
        wait_http(f"http://127.0.0.1:{port}/metrics", process, log, 30)
        yield Sidecar(f"http://127.0.0.1:{port}", log)
    finally:
        stop(process, grace=20)


def chat(stack: Stack, prompt: str) -> float:
    """One streaming chat completion through the frontend; the client's TTFT. Chat, not /v1/completions: for a
    streaming completion the frontend counts TTFT only when a chunk carries text, which the mocker's random
    tokens often do not (tests/fixtures/dynamo/live-1.6.1/README.md)."""
    body: dict[str, Any] = {"model": stack.model, "messages": [{"role": "user", "content": prompt}],
                            "max_tokens": 4, "stream": True}
    return first_chunk_seconds(f"{stack.frontend_url}/v1/chat/completions", body)
