"""`make e2e`: a real `vllm serve` (the CPU build) on a tiny local Llama, with `kvscope run` beside it.

The venv comes from e2e/setup_vllm.sh (Makefile: KVSCOPE_E2E_VENV); the model is built once per session
with that venv's Python. Both processes write their logs into the session's temporary folder, and a
failing start shows the log's tail.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from testkit.live_vllm import SMALL_G1_BLOCKS
from testkit.processes import free_port, stop, wait_http

HERE = Path(__file__).resolve().parent
BLOCK_TOKENS = 32  # the CPU attention backend needs a multiple of 32
MAX_MODEL_LEN = 2048
KV_BYTES_PER_TOKEN = 512  # tiny_llama.py: 2 layers × 2 (K, V) × 2 KV heads × head dim 32 × 2 bytes (bf16)
SIDECAR_CONFIG = HERE.parent / "deploy" / "kubernetes" / "configmap.yaml"


def sidecar_config() -> str:
    """kvscope.toml as the inference pod mounts it (deploy/kubernetes/configmap.yaml)."""
    text: str = yaml.safe_load(SIDECAR_CONFIG.read_text())["data"]["kvscope.toml"]
    return text


@dataclass(frozen=True)
class Live:
    model: str
    engine_url: str  # http://127.0.0.1:PORT
    agent_url: str
    folder: Path
    block_tokens: int = BLOCK_TOKENS
    kv_bytes_per_token: int = KV_BYTES_PER_TOKEN
    restart: Callable[[], None] = lambda: None  # restarts the engine (launch sets it)


def _installed(variable: str, folder: str, executable: str, what: str, setup: str) -> Path:
    """The venv `make e2e` set up (its path in `variable`, else .e2e/`folder`), failing when it lacks `executable`."""
    path = Path(os.environ.get(variable, HERE.parent / ".e2e" / folder))
    if not (path / "bin" / executable).exists():
        pytest.fail(f"no {what} at {path}: run `make e2e` (it runs e2e/{setup} first)")
    return path


@pytest.fixture(scope="session")
def venv() -> Path:
    return _installed("KVSCOPE_E2E_VENV", "vllm", "vllm", "vLLM venv", "setup_vllm.sh")


@pytest.fixture(scope="session")
def aiperf() -> Path:
    """AIPerf's executable, from e2e/setup_aiperf.sh (Makefile: KVSCOPE_E2E_AIPERF_VENV)."""
    return _installed("KVSCOPE_E2E_AIPERF_VENV", "aiperf", "aiperf", "AIPerf", "setup_aiperf.sh") / "bin" / "aiperf"


@pytest.fixture(scope="session")
def model(venv: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("tiny-llama")
    subprocess.run([str(venv / "bin" / "python"), str(HERE / "tiny_llama.py"), str(folder)], check=True,
                   capture_output=True)
    return folder


@contextmanager
def launch(venv: Path, model: Path, folder: Path, gpu_blocks: int | None = None,
           max_model_len: int = MAX_MODEL_LEN, reuse_sample_rate: float | None = None,
           engine_args: Sequence[str] = ()) -> Iterator[Live]:
    """vllm serve and kvscope run, each on free ports; `gpu_blocks` forces G1 small (blocks are evicted);
    `reuse_sample_rate` overrides the KV-event collector's default (1/16) for the what-if analysis;
    `engine_args` go to `vllm serve` as they are (e.g. a KV connector)."""
    engine, events, replay, otlp, agent = (free_port() for _ in range(5))
    env = {**os.environ, "VLLM_TARGET_DEVICE": "cpu", "VLLM_CPU_KVCACHE_SPACE": "1",
           "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf"}
    kv_events = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": f"tcp://*:{events}",
                 "replay_endpoint": f"tcp://*:{replay}"}  # as inference-pod.yaml
    engine_log = folder / "vllm.log"
    command = [str(venv / "bin" / "vllm"), "serve", str(model), "--host", "127.0.0.1", "--port", str(engine),
               "--block-size", str(BLOCK_TOKENS), "--max-model-len", str(max_model_len), "--enable-prefix-caching",
               "--kv-events-config", json.dumps(kv_events),
               "--otlp-traces-endpoint", f"http://127.0.0.1:{otlp}/v1/traces",
               *(["--num-gpu-blocks-override", str(gpu_blocks)] if gpu_blocks else []), *engine_args]
    engines = [subprocess.Popen(command, env=env, stdout=engine_log.open("wb"), stderr=subprocess.STDOUT)]

    def restart() -> None:
        """vLLM stopped and started again on the same ports (a pod's engine container restarting)."""
        stop(engines[-1], grace=30)
        engines.append(subprocess.Popen(command, env=env, stdout=engine_log.open("ab"), stderr=subprocess.STDOUT))
        wait_http(f"http://127.0.0.1:{engine}/v1/models", engines[-1], engine_log, 300)
    config = folder / "kvscope.toml"
    config.write_text(sidecar_config())  # the pod's own, as deploy/ documents it
    overrides = {  # what differs from the pod here, set as an operator would: KVSCOPE_* variables
        "AGENT__PROC_ROOT": "/proc", "AGENT__SYS_ROOT": "/sys",  # no host mounts outside a pod
        "EXPORTERS__PROMETHEUS__LISTEN": f"127.0.0.1:{agent}",
        "COLLECTORS__VLLM__URLS": f"http://127.0.0.1:{engine}/metrics",
        "COLLECTORS__VLLM_KV_EVENTS__ENDPOINT": f"tcp://127.0.0.1:{events}",
        "COLLECTORS__VLLM_KV_EVENTS__REPLAY_ENDPOINT": f"tcp://127.0.0.1:{replay}",
        "COLLECTORS__VLLM_KV_EVENTS__MODEL": str(model),
        "COLLECTORS__VLLM_KV_EVENTS__KV_BYTES_PER_TOKEN": str(KV_BYTES_PER_TOKEN),
        "COLLECTORS__OTLP_TRACES__LISTEN": f"127.0.0.1:{otlp}",
        "COLLECTORS__OTLP_TRACES__MODEL": str(model),
        "EXPORTERS__JSONL__ENABLED": "true", "EXPORTERS__JSONL__PATH": str(folder / "kvscope-requests.jsonl"),
    }
    if reuse_sample_rate is not None:
        overrides["COLLECTORS__VLLM_KV_EVENTS__REUSE_SAMPLE_RATE"] = repr(reuse_sample_rate)
    sidecar_env = {k: v for k, v in os.environ.items() if not k.startswith("KVSCOPE_")}
    sidecar_env.update({f"KVSCOPE_{key}": value for key, value in overrides.items()})
    agent_log = folder / "kvscope.log"
    sidecar = subprocess.Popen([str(Path(sys.executable).parent / "kvscope"), "run", "--config", str(config)],
                               env=sidecar_env, stdout=agent_log.open("wb"), stderr=subprocess.STDOUT)
    try:
        wait_http(f"http://127.0.0.1:{agent}/metrics", sidecar, agent_log, 30)
        wait_http(f"http://127.0.0.1:{engine}/v1/models", engines[0], engine_log, 300)
        yield Live(str(model), f"http://127.0.0.1:{engine}", f"http://127.0.0.1:{agent}", folder, restart=restart)
    finally:
        stop(engines[-1], grace=30)
        stop(sidecar, grace=30)


@pytest.fixture(scope="module")
def live(venv: Path, model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    with launch(venv, model, tmp_path_factory.mktemp("live")) as running:
        yield running




@pytest.fixture(scope="module")
def small_live(venv: Path, model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    with launch(venv, model, tmp_path_factory.mktemp("small"), gpu_blocks=SMALL_G1_BLOCKS,
                max_model_len=1024) as running:
        yield running


@pytest.fixture(scope="module")
def launcher(venv: Path, model: Path, tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Any]:
    """launch() for a test that starts engines of its own: launcher(name, gpu_blocks=..., ...), in a folder
    of its own or in `folder` (where the engine's log, vllm.log, is then found)."""
    def start(name: str, folder: Path | None = None, **kwargs: Any) -> Any:
        return launch(venv, model, folder or tmp_path_factory.mktemp(name), **kwargs)
    return start


@pytest.fixture(scope="session")
def dynamo_venv() -> Path:
    """ai-dynamo's venv, from e2e/setup_dynamo.sh (Makefile: KVSCOPE_E2E_DYNAMO_VENV)."""
    return _installed("KVSCOPE_E2E_DYNAMO_VENV", "dynamo", "python", "Dynamo venv", "setup_dynamo.sh")


@pytest.fixture(scope="session")
def dynamo_model(dynamo_venv: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model's tokenizer and config (the mocker loads nothing else), built with Dynamo's venv."""
    folder = tmp_path_factory.mktemp("tiny-llama-tokenizer")
    subprocess.run([str(dynamo_venv / "bin" / "python"), str(HERE / "tiny_llama.py"), str(folder), "--no-weights"],
                   check=True, capture_output=True)
    return folder
