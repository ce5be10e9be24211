"""`kvscope run` as an operator runs it: a real process, a real port, SIGTERM to stop."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from testkit.http import free_port


def test_run_serves_metrics_and_stops_cleanly_on_sigterm(tmp_path: Path) -> None:
    port = free_port()
    config = tmp_path / "kvscope.toml"
    config.write_text(f"[exporters.prometheus]\nlisten = '127.0.0.1:{port}'\n")
    proc = subprocess.Popen([sys.executable, "-m", "kvscope.agent.app.cli", "run", "--config", str(config)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        body = ""
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).read().decode()
                break
            except OSError:
                time.sleep(0.1)
        assert 'kvscope_build_info{version="' in body
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=20)
        assert proc.returncode == 0, err
        assert "shutting down" in err and "Traceback" not in err
    finally:
        if proc.poll() is None:
            proc.kill()


def test_port_in_use_is_a_one_line_error(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        config = tmp_path / "kvscope.toml"
        config.write_text(f"[exporters.prometheus]\nlisten = '127.0.0.1:{port}'\n")
        proc = subprocess.run([sys.executable, "-m", "kvscope.agent.app.cli", "run", "--config", str(config)],
                              capture_output=True, text=True, timeout=30)
    assert proc.returncode == 2
    assert f"cannot bind 127.0.0.1:{port}" in proc.stderr
    assert "Traceback" not in proc.stderr
