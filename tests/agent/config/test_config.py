"""Configuration: defaults, environment overrides, and one clear line for every mistake."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass, field

import pytest

from kvscope.agent.config.settings import ConfigError, load_config
from kvscope.agent.core.pipeline import CollectorSpec, Components
from kvscope.exporters.prometheus.server import SPEC as PROMETHEUS
from kvscope.exporters.registry import sink_specs


@dataclass
class FakeOptions:
    urls: list[str] = field(default_factory=list)
    size: int = 4

    def validate(self, path: str) -> None:
        if not self.urls:
            raise ConfigError(f"{path}.urls: at least one URL is required when enabled")


SPECS = Components({
    "probe": CollectorSpec("probe", "test", FakeOptions, lambda o, c: None, (), enabled_by_default=False),  # type: ignore[arg-type, return-value]
}, {}, sink_specs())


def test_embedded_defaults() -> None:
    config = load_config(None, SPECS, environ={})
    assert config.agent.interval == 1.0
    assert config.exporter(PROMETHEUS).listen == "0.0.0.0:9474"
    settings, _ = config.collectors["probe"]
    assert settings.enabled is False


def test_env_overrides_are_typed_by_the_option() -> None:
    env = {
        "KVSCOPE_AGENT__INTERVAL": "2.5",
        "KVSCOPE_COLLECTORS__PROBE__ENABLED": "true",
        "KVSCOPE_COLLECTORS__PROBE__URLS": '["http://127.0.0.1:8000/metrics"]',
        "KVSCOPE_EXPORTERS__PROMETHEUS__LISTEN": "127.0.0.1:9999",
    }
    config = load_config("[agent]\ninterval = 1\n", SPECS, environ=env)
    assert config.agent.interval == 2.5
    assert config.exporter(PROMETHEUS).listen == "127.0.0.1:9999"
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
        ("[agent]\nhistory = 600\n", "agent.history: removed: the store keeps no history"),
        ("[collectors.correlation]\nfit_window = 9\n", "collectors.correlation: moved to [analyses.correlation]"),
    ],
)
def test_cli_config_check_prints_one_line_and_exits_nonzero(tmp_path: object, text: str, needle: str) -> None:
    from pathlib import Path

    path = Path(str(tmp_path)) / "kvscope.toml"
    path.write_text(text)
    proc = subprocess.run([sys.executable, "-m", "kvscope.agent.app.cli", "config", "check", str(path)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert needle in proc.stderr
    assert "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_cli_config_check_accepts_a_good_file(tmp_path: object) -> None:
    from pathlib import Path

    path = Path(str(tmp_path)) / "kvscope.toml"
    path.write_text("[agent]\ninterval = 2\n")
    proc = subprocess.run([sys.executable, "-m", "kvscope.agent.app.cli", "config", "check", str(path)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "ok" in proc.stdout


def test_printed_defaults_load_back_for_every_registered_collector() -> None:
    from kvscope.agent.app.wiring import components
    from kvscope.agent.config.settings import defaults_toml

    parts = components()
    text = defaults_toml(parts)
    config = load_config(text, parts, environ={})
    assert config.agent.interval == 1.0
    for name, spec in parts.collectors.items():
        assert f"[collectors.{name}]" in text
        assert config.collectors[name][0].enabled == spec.enabled_by_default
    for name, analysis in parts.analyses.items():
        assert f"[analyses.{name}]" in text
        assert config.analyses[name][0].enabled == analysis.enabled_by_default


# -- environment values typed by the option, flags, precedence -----------------------------------------


@dataclass
class TypedOptions:
    dp_rank: str = "0"
    model: str = ""
    ratio: float = 0.5
    count: int = 1
    on: bool = False
    urls: list[str] = field(default_factory=list)
    tiers: dict[str, str] = field(default_factory=dict)


TYPED = Components({
    "typed": CollectorSpec("typed", "test", TypedOptions, lambda o, c: None, (), enabled_by_default=True),  # type: ignore[arg-type, return-value]
}, {}, sink_specs())


def typed(environ: dict[str, str]) -> TypedOptions:
    options = load_config(None, TYPED, environ=environ).collectors["typed"][1]
    assert isinstance(options, TypedOptions)
    return options


def test_env_strings_stay_strings_whatever_they_look_like() -> None:
    got = typed({"KVSCOPE_COLLECTORS__TYPED__DP_RANK": "1", "KVSCOPE_COLLECTORS__TYPED__MODEL": "2026-12-01"})
    assert got.dp_rank == "1" and got.model == "2026-12-01"


def test_env_numbers_booleans_lists_and_tables_parse_by_type() -> None:
    got = typed({"KVSCOPE_COLLECTORS__TYPED__RATIO": "0.25", "KVSCOPE_COLLECTORS__TYPED__COUNT": "7",
                 "KVSCOPE_COLLECTORS__TYPED__ON": "yes",
                 "KVSCOPE_COLLECTORS__TYPED__URLS": "http://a:8000/metrics, http://b:8000/metrics",
                 "KVSCOPE_COLLECTORS__TYPED__TIERS": '{ disk = "G3" }'})
    assert (got.ratio, got.count, got.on) == (0.25, 7, True)
    assert got.urls == ["http://a:8000/metrics", "http://b:8000/metrics"]
    assert got.tiers == {"disk": "G3"}
    assert typed({"KVSCOPE_COLLECTORS__TYPED__URLS": '["http://a:1/m"]'}).urls == ["http://a:1/m"]


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("KVSCOPE_COLLECTORS__TYPED__COUNT", "7.5", "KVSCOPE_COLLECTORS__TYPED__COUNT (collectors.typed.count): "
                                                   "expected an integer, got '7.5'"),
        ("KVSCOPE_COLLECTORS__TYPED__ON", "maybe", "KVSCOPE_COLLECTORS__TYPED__ON (collectors.typed.on): "
                                                  "expected true/false, got 'maybe'"),
        ("KVSCOPE_AGENT__LOG_LEVEL", "loud", "KVSCOPE_AGENT__LOG_LEVEL (agent.log_level): expected one of"),
        ("KVSCOPE_COLLECTORS__TYPED__TIERS", "disk=G3", "KVSCOPE_COLLECTORS__TYPED__TIERS (collectors.typed.tiers)"),
    ],
)
def test_a_bad_env_value_names_the_variable_and_the_key(name: str, value: str, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(None, TYPED, environ={name: value})
    assert message in str(info.value)


def parse_run_flags(argv: list[str]) -> object:
    from kvscope.agent.app.cli import build_parser

    return build_parser(["run", *argv]).parse_args(["run", *argv])


def test_flag_beats_environment_beats_file_beats_default(tmp_path: object) -> None:
    from pathlib import Path

    from kvscope.agent.app.wiring import components
    from kvscope.agent.config.flags import flag_overrides
    from kvscope.agent.config.settings import load_config_file

    path = Path(str(tmp_path)) / "kvscope.toml"
    path.write_text("[agent]\nproc_root = '/file/proc'\nsys_root = '/file/sys'\nlog_level = 'error'\n"
                    "[collectors.disk]\nenabled = false\n")
    env = {"KVSCOPE_AGENT__PROC_ROOT": "/env/proc", "KVSCOPE_AGENT__SYS_ROOT": "/env/sys"}
    args = parse_run_flags(["--config", str(path), "--path.procfs", "/flag/proc", "--collector.disk",
                            "--no-collector.network", "--no-analysis.correlation", "--log.format", "json"])
    config = load_config_file(str(path), components(), environ=env, flags=flag_overrides(args))  # type: ignore[arg-type]
    assert config.agent.proc_root == "/flag/proc"  # flag over env over file
    assert config.agent.sys_root == "/env/sys"  # env over file
    assert config.agent.log_level == "error"  # file over default
    assert config.agent.log_format == "json" and config.agent.interval == 1.0
    assert config.collectors["disk"][0].enabled and not config.collectors["network"][0].enabled
    assert not config.analyses["correlation"][0].enabled


def test_every_exporter_flag_sets_its_key() -> None:
    from kvscope.agent.app.wiring import components
    from kvscope.agent.config.flags import flag_overrides
    from kvscope.agent.config.settings import load_config as load

    args = parse_run_flags(["--web.listen-address", "127.0.0.1:9999", "--web.config.file", "/etc/web.yml",
                            "--path.sysfs", "/host/sys", "--log.level", "debug"])
    config = load(None, components(), environ={}, flags=flag_overrides(args))  # type: ignore[arg-type]
    assert config.exporter(PROMETHEUS).listen == "127.0.0.1:9999"
    assert config.exporter(PROMETHEUS).web_config_file == "/etc/web.yml"
    assert config.agent.sys_root == "/host/sys" and config.agent.log_level == "debug"


def test_a_bad_flag_value_names_the_flag() -> None:
    from kvscope.agent.app.wiring import components
    from kvscope.agent.config.flags import flag_overrides
    from kvscope.agent.config.settings import load_config as load

    with pytest.raises(ConfigError, match=r"^--log.level \(agent.log_level\): expected one of"):
        load(None, components(), environ={}, flags=flag_overrides(parse_run_flags(["--log.level", "loud"])))  # type: ignore[arg-type]


# -- errors inside nested tables, tables of lists, optional options (msgspec's `$.path` worded as keys) ----


@dataclass
class Limits:
    workers: int = 4

    def validate(self, path: str) -> None:
        if self.workers < 1:
            raise ConfigError(f"{path}.workers: must be >= 1, got {self.workers}")


@dataclass
class ShapedOptions:
    limits: Limits = field(default_factory=Limits)
    paths: dict[str, list[str]] = field(default_factory=dict)
    scales: list[float] = field(default_factory=list)
    deadline: float | None = None


SHAPED = Components({
    "shaped": CollectorSpec("shaped", "test", ShapedOptions, lambda o, c: None, (), enabled_by_default=True),  # type: ignore[arg-type, return-value]
}, {}, sink_specs())


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[collectors.shaped.limits]\nworkers = 'x'\n",
         "collectors.shaped.limits.workers: expected an integer, got 'x'"),
        ("[collectors.shaped.limits]\ncolour = 1\n",
         "collectors.shaped.limits.colour: unknown key (allowed: workers)"),
        ("[collectors.shaped]\nlimits = 5\n", "collectors.shaped.limits: expected a table, got int"),
        ("[collectors.shaped]\npaths = { G3 = ['a'], G4 = ['b', 1] }\n",
         "collectors.shaped.paths.G4[1]: expected a string, got 1"),
        ("[collectors.shaped]\npaths = ['a']\n", "collectors.shaped.paths: expected a table of a list of a string, "
                                                 "got ['a']"),
        ("[collectors.shaped]\nscales = [1, 'x']\n", "collectors.shaped.scales[1]: expected a number, got 'x'"),
        ("[collectors.shaped]\ndeadline = 'x'\n", "collectors.shaped.deadline: expected a number, got 'x'"),
        ("[collectors.shaped]\nenabled = false\nlimits = { workers = 0 }\n",
         "collectors.shaped.limits.workers: must be >= 1, got 0"),  # a disabled section's tables are still checked
        ("[agent]\ninterval = '2'\n", "agent.interval: expected a number, got '2'"),  # a file's text is not parsed
        ("agent = 5\n", "agent: expected a table, got int"),
        ("agent = 'fast'\n", "agent: expected a table, got str"),
    ],
)
def test_a_mistake_inside_a_table_names_its_whole_key(text: str, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(text, SHAPED, environ={})
    assert str(info.value) == message


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("KVSCOPE_COLLECTORS__SHAPED__LIMITS", "5",
         "KVSCOPE_COLLECTORS__SHAPED__LIMITS (collectors.shaped.limits): expected a table, got '5'"),
        ("KVSCOPE_COLLECTORS__SHAPED__SCALES", "0.5, abc",
         "KVSCOPE_COLLECTORS__SHAPED__SCALES (collectors.shaped.scales[1]): expected a number, got 'abc'"),
        ("KVSCOPE_COLLECTORS__SHAPED__SCALES", "[0.5",
         "KVSCOPE_COLLECTORS__SHAPED__SCALES (collectors.shaped.scales): expected a list of a number, got '[0.5'"),
        ("KVSCOPE_COLLECTORS__SHAPED__PATHS", "{ G4 = [1] }",
         "KVSCOPE_COLLECTORS__SHAPED__PATHS (collectors.shaped.paths.G4[0]): expected a string, got 1"),
        ("KVSCOPE_COLLECTORS__SHAPED__DEADLINE", "null",
         "KVSCOPE_COLLECTORS__SHAPED__DEADLINE (collectors.shaped.deadline): expected a number, got 'null'"),
        ("KVSCOPE_COLLECTORS__SHAPED__LIMITS__WORKERS", "0",
         "collectors.shaped.limits.workers: must be >= 1, got 0"),
    ],
)
def test_a_bad_env_value_inside_a_table_names_the_variable_and_the_whole_key(name: str, value: str,
                                                                               message: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(None, SHAPED, environ={name: value})
    assert str(info.value) == message


def test_env_values_reach_nested_tables_and_table_entries() -> None:
    env = {"KVSCOPE_COLLECTORS__SHAPED__LIMITS__WORKERS": " 7 ", "KVSCOPE_COLLECTORS__SHAPED__PATHS__G3": "a, b",
           "KVSCOPE_COLLECTORS__SHAPED__DEADLINE": "3", "KVSCOPE_COLLECTORS__SHAPED__SCALES": "0.5, 2"}
    options = load_config(None, SHAPED, environ=env).collectors["shaped"][1]
    assert options == ShapedOptions(limits=Limits(workers=7), paths={"g3": ["a", "b"]}, scales=[0.5, 2.0],
                                    deadline=3.0)
    assert isinstance(options.deadline, float) and isinstance(options.scales[1], float)


def test_a_missing_required_key_is_named() -> None:
    from kvscope.agent.config.binding import bind
    from kvscope.agent.config.settings import JobSettings

    with pytest.raises(ConfigError) as info:
        bind(JobSettings, {"interval": 2}, "collectors.probe")
    assert str(info.value) == "collectors.probe.enabled: required key not set"
