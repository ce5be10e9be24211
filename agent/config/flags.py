"""The command-line flags of `kvscope run` (and `kvscope config check`), as Prometheus exporters spell them.

Each flag sets one configuration key and wins over the environment and the file:

| flag | key |
|---|---|
| `--config FILE` | the TOML file itself |
| `--web.listen-address HOST:PORT` | `exporters.prometheus.listen` |
| `--web.config.file FILE` | `exporters.prometheus.web_config_file` |
| `--path.procfs DIR` | `agent.proc_root` |
| `--path.sysfs DIR` | `agent.sys_root` |
| `--collector.NAME` / `--no-collector.NAME` | `collectors.NAME.enabled` |
| `--analysis.NAME` / `--no-analysis.NAME` | `analyses.NAME.enabled` |
| `--log.level LEVEL` | `agent.log_level` |
| `--log.format logfmt\\|json` | `agent.log_format` |
"""

from __future__ import annotations

import argparse
from typing import get_args

from kvscope.agent.config.binding import Override
from kvscope.agent.config.settings import DEFAULT_PORT, LogFormat, LogLevel
from kvscope.agent.core.pipeline import Components

# flag -> (argparse dest, configuration key path, metavar, help)
VALUE_FLAGS = (
    ("--web.listen-address", "web_listen_address", ["exporters", "prometheus", "listen"], "HOST:PORT",
     f"address /metrics listens on (default 0.0.0.0:{DEFAULT_PORT}; port 0 = any free port)"),
    ("--web.config.file", "web_config_file", ["exporters", "prometheus", "web_config_file"], "FILE",
     "exporter-toolkit web config: TLS and basic auth (needs the 'web' extra)"),
    ("--path.procfs", "path_procfs", ["agent", "proc_root"], "DIR", "the host's /proc (default /proc)"),
    ("--path.sysfs", "path_sysfs", ["agent", "sys_root"], "DIR", "the host's /sys (default /sys)"),
    ("--log.level", "log_level", ["agent", "log_level"], "LEVEL",
     f"one of {', '.join(get_args(LogLevel))} (default info)"),
    ("--log.format", "log_format", ["agent", "log_format"], "FORMAT",
     f"one of {', '.join(get_args(LogFormat))} (default logfmt)"),
)
_TOGGLES = "toggles"  # argparse dest collecting (kind, name, enabled) in command-line order


def add_flags(parser: argparse.ArgumentParser, components: Components) -> None:
    parser.add_argument("--config", metavar="FILE", help="TOML config file (default: embedded defaults)")
    for flag, dest, _, metavar, help_text in VALUE_FLAGS:
        parser.add_argument(flag, dest=dest, metavar=metavar, help=help_text)
    for kind, section, specs in (("collector", "collectors", components.collectors),
                                 ("analysis", "analyses", components.analyses)):
        group = parser.add_argument_group(f"{kind}s (--{kind}.NAME enables, --no-{kind}.NAME disables)")
        for name, spec in specs.items():
            default = "on" if spec.enabled_by_default else "off"
            group.add_argument(f"--{kind}.{name}", dest=_TOGGLES, action="append_const",
                               const=(section, name, True), help=f"{spec.description} (default {default})")
            group.add_argument(f"--no-{kind}.{name}", dest=_TOGGLES, action="append_const",
                               const=(section, name, False), help=argparse.SUPPRESS)


def flag_overrides(args: argparse.Namespace) -> list[tuple[list[str], Override]]:
    """The configuration keys the flags set, in the form load_config applies last."""
    out: list[tuple[list[str], Override]] = []
    for flag, dest, path, _, _ in VALUE_FLAGS:
        value = getattr(args, dest, None)
        if value is not None:
            out.append((path, Override(value, flag)))
    for section, name, enabled in getattr(args, _TOGGLES, None) or []:
        flag = f"--{'' if enabled else 'no-'}{'collector' if section == 'collectors' else 'analysis'}.{name}"
        out.append(([section, name, "enabled"], Override("true" if enabled else "false", flag)))
    return out
