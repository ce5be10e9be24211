"""Configuration: defaults, environment overrides, and one clear line for every mistake."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass, field

import pytest

from kvscope.agent.config import ConfigError, load_config
from kvscope.collectors.base import CollectorSpec


@dataclass
class FakeOptions:
    urls: list[str] = field(default_factory=list)
    size: int = 4

    def validate(self, path: str) -> None:
        if not self.urls:
            raise ConfigError(f"{path}.urls: at least one URL is required when enabled")


SPECS = {
    "probe": CollectorSpec("probe", "test", FakeOptions, lambda o, c: None, (), enabled_by_default=False),  # type: ignore[arg-type, return-value]
}


def test_embedded_defaults() -> None:
    config = load_config(None, SPECS, environ={})
    assert config.agent.interval == 1.0
    assert config.exporters.prometheus.listen == "0.0.0.0:9474"
    settings, _ = config.collectors["probe"]
    assert settings.enabled is False


def test_env_overrides_take_toml_values() -> None:
    env = {
        "KVSCOPE_AGENT__INTERVAL": "2.5",
        "KVSCOPE_COLLECTORS__PROBE__ENABLED": "true",
        "KVSCOPE_COLLECTORS__PROBE__URLS": '["http://127.0.0.1:8000/metrics"]',
        "KVSCOPE_EXPORTERS__PROMETHEUS__LISTEN": "127.0.0.1:9999",
    }
    config = load_config("[agent]\ninterval = 1\n", SPECS, environ=env)
    assert config.agent.interval == 2.5
    assert config.exporters.prometheus.listen == "127.0.0.1:9999"
    settings, options = config.collectors["probe"]
    assert settings.enabled and options.urls == ["http://127.0.0.1:8000/metrics"]
    assert config.interval_of("probe") == 2.5


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[agent]\nintervall = 1\n", "agent.intervall: unknown key (allowed: "),
        ("[agent]\ninterval = 'fast'\n", "agent.interval: expected a number, got 'fast'"),
        ("[agent]\ninterval = -1\n", "agent.interval: must be > 0"),
        ("[agent]\nlog_level = 'loud'\n", "agent.log_level: expected one of 'debug', 'info'"),
        ("[exporters.prometheus]\nlisten = '0.0.0.0:99999'\n", "exporters.prometheus.listen: port must be 0..65535"),
        ("[exporters.prometheus]\nlisten = 'nohost'\n", "exporters.prometheus.listen: expected HOST:PORT"),
        ("[collectors.nope]\nenabled = true\n", "collectors.nope: unknown collector (allowed: probe)"),
        ("[collectors.probe]\nenabled = true\n", "collectors.probe.urls: at least one URL"),
        ("[collectors.probe]\nsize = 1.5\n", "collectors.probe.size: expected an integer, got 1.5"),
        ("[collectors.probe]\ncolour = 1\n", "collectors.probe.colour: unknown key (allowed: size, urls)"),
        ("[collectors.probe]\ninterval = 0\n", "collectors.probe.interval: must be > 0"),
        ("[surprise]\n", "surprise: unknown section"),
        ("agent = [", "config: not valid TOML"),
    ],
)
def test_every_mistake_names_its_key(text: str, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(text, SPECS, environ={})
    assert message in str(info.value)
    assert "\n" not in str(info.value)


def test_disabled_collector_options_still_reject_unknown_keys_but_skip_validation() -> None:
    config = load_config("[collectors.probe]\nurls = []\n", SPECS, environ={})
    assert config.collectors["probe"][0].enabled is False


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("[agent]\nbogus = 1\n", "agent.bogus: unknown key"),
        ("[exporters.prometheus]\nlisten = '1.2.3.4:70000'\n", "port must be 0..65535"),
        ("[agent]\nhistory = 'many'\n", "agent.history: expected an integer"),
    ],
)
def test_cli_config_check_prints_one_line_and_exits_nonzero(tmp_path: object, text: str, needle: str) -> None:
    from pathlib import Path

    path = Path(str(tmp_path)) / "kvscope.toml"
    path.write_text(text)
    proc = subprocess.run([sys.executable, "-m", "kvscope.agent.cli", "config", "check", str(path)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert needle in proc.stderr
    assert "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_cli_config_check_accepts_a_good_file(tmp_path: object) -> None:
    from pathlib import Path

    path = Path(str(tmp_path)) / "kvscope.toml"
    path.write_text("[agent]\ninterval = 2\n")
    proc = subprocess.run([sys.executable, "-m", "kvscope.agent.cli", "config", "check", str(path)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "ok" in proc.stdout


def test_printed_defaults_load_back_for_every_registered_collector() -> None:
    from kvscope.agent.config import defaults_toml
    from kvscope.collectors.registry import collector_specs

    specs = collector_specs()
    text = defaults_toml(specs)
    config = load_config(text, specs, environ={})
    assert config.agent.interval == 1.0
    for name, spec in specs.items():
        assert f"[collectors.{name}]" in text
        assert config.collectors[name][0].enabled == spec.enabled_by_default
