"""The CLI as an operator meets it: exporter flags, `config check` of what `run` needs, log formats,
`--version`, and a missing extra as one line."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
import time
import urllib.request
from pathlib import Path

import pytest

from kvscope import __version__
from testkit.http import free_port

CLI = [sys.executable, "-m", "kvscope.agent.app.cli"]


def cli(*args: str, env: dict[str, str] | None = None, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    import os

    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})


def test_version_flag_and_command() -> None:
    for args in (["--version"], ["version"]):
        proc = cli(*args)
        assert proc.returncode == 0 and proc.stdout.strip() == f"kvscope {__version__}"


def test_config_check_names_a_missing_host_root(tmp_path: Path) -> None:
    proc = cli("config", "check", "--path.procfs", str(tmp_path / "host" / "proc"))
    assert proc.returncode == 2
    root = tmp_path / "host" / "proc"
    assert f"agent.proc_root: {root} is not a directory (read by the disk, network, nfs, lustre collectors)" \
        in proc.stderr
    assert "--path.procfs" in proc.stderr and "Traceback" not in proc.stderr


def test_config_check_is_ok_without_the_collectors_that_need_the_root(tmp_path: Path) -> None:
    missing = str(tmp_path / "nothing")
    off = [f"--no-collector.{n}" for n in ("disk", "network", "nfs", "lustre", "gpfs", "rdma")]
    proc = cli("config", "check", "--path.procfs", missing, "--path.sysfs", missing, *off)
    assert proc.returncode == 0, proc.stderr
    assert "ok; enabled: process, nvml, engine_discovery, correlation" in proc.stdout


def test_config_check_loads_the_web_config_run_would_load(tmp_path: Path) -> None:
    web = tmp_path / "web.yml"
    web.write_text("tls_server_config:\n  cert_file: /nonexistent/cert.pem\n  key_file: /nonexistent/key.pem\n")
    proc = cli("config", "check", "--web.config.file", str(web))
    assert proc.returncode == 2 and "cert" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    web.write_text("basic_auth_users:\n  alice: $2b$04$4dKJgDCQzrIpF6yW1lO7BOuu0d.mBAu8CJ4vAqUrzW/5YFwS/8RPa\n")
    assert cli("config", "check", "--web.config.file", str(web)).returncode == 0


def test_config_check_refuses_a_listen_host_that_does_not_resolve() -> None:
    proc = cli("config", "check", "--web.listen-address", "no-such-host.invalid:9474")
    assert proc.returncode == 2 and "cannot resolve host 'no-such-host.invalid'" in proc.stderr


def test_run_refuses_what_config_check_refuses(tmp_path: Path) -> None:
    proc = cli("run", "--path.sysfs", str(tmp_path / "sys"), "--web.listen-address", "127.0.0.1:0")
    assert proc.returncode == 2 and "agent.sys_root:" in proc.stderr and "Traceback" not in proc.stderr


HIDE_NUMPY = textwrap.dedent("""
    import sys
    sys.modules["numpy"] = None  # as if the 'reference' extra were not installed
    from kvscope.agent.app.cli import main
    sys.exit(main(sys.argv[1:]))
""")


@pytest.mark.parametrize("command", ["demo", "selftest", "reference"])
def test_a_missing_extra_is_one_line_naming_it(command: str) -> None:
    proc = subprocess.run([sys.executable, "-c", HIDE_NUMPY, command], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.strip() == (f"kvscope: kvscope {command} needs the 'reference' extra (numpy not installed): "
                                   "pip install 'kvscope[reference]'")


def test_help_lists_every_command_without_loading_them() -> None:
    proc = cli("--help")
    assert proc.returncode == 0
    for command in ("run", "config", "catalogue", "kv-size", "reference", "selftest", "demo", "analyze"):
        assert command in proc.stdout
    run_help = cli("run", "--help").stdout
    for flag in ("--web.listen-address", "--web.config.file", "--path.procfs", "--path.sysfs", "--collector.disk",
                 "--analysis.correlation", "--log.level", "--log.format"):
        assert flag in run_help


@pytest.mark.integration
@pytest.mark.parametrize("fmt", ["logfmt", "json"])
def test_run_with_flags_only_logs_in_the_chosen_format(fmt: str) -> None:
    port = free_port()
    proc = subprocess.Popen([*CLI, "run", "--web.listen-address", f"127.0.0.1:{port}", "--log.format", fmt,
                             "--no-collector.nvml", "--collector.disk"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        body = ""
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and "process_cpu_seconds_total" not in body:
            try:
                body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).read().decode()
            except OSError:
                time.sleep(0.1)
        assert 'kvscope_collector_up{collector="disk"}' in body and 'collector="nvml"' not in body
        assert 'kvscope_analysis_up{analysis="correlation"}' in body
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert any("running on 127.0.0.1" in line for line in lines)
    for line in lines:
        if fmt == "json":
            assert {"ts", "level", "logger", "msg"} <= set(json.loads(line))
        else:
            assert line.startswith("ts=") and " level=" in line and " msg=" in line
