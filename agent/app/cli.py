"""The `kvscope` command.

`run` (the sidecar), `config check|defaults`, `catalogue` and `version` are the agent's own. The
reference pipeline's commands (`kv-size`, `reference`, `selftest`, `demo`) and `analyze` are listed in
`--help` but their modules are imported only when one of them is the command given: the sidecar's path
never imports them, and a missing extra is one line naming it.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import logging
import signal
import sys
from collections.abc import Sequence

from kvscope import __version__
from kvscope.agent.app import preflight
from kvscope.agent.app.wiring import Agent, build_agent, build_catalogue, components
from kvscope.agent.config import extras, flags
from kvscope.agent.config.settings import Config, ConfigError, load_config_file
from kvscope.agent.runtime import logs
from kvscope.agent.runtime.os_signals import SignalWaiter
from kvscope.exporters.prometheus.server import SPEC as PROMETHEUS

log = logging.getLogger("kvscope")

# command -> (module whose add_commands(sub) defines it, extra it needs or "", help)
EXTENSIONS = {
    "kv-size": ("kvscope.agent.tools.reference.commands", "",
                "KV bytes per token, total size, and what fits in each tier"),
    "reference": ("kvscope.agent.tools.reference.commands", "reference", "the reference tier pipeline (serve)"),
    "selftest": ("kvscope.agent.tools.selftest.commands", "reference",
                 "run the reference engine with the agent attached; compare with truth"),
    "demo": ("kvscope.agent.tools.selftest.commands", "reference",
             "shared prompts through G1-G4 with the agent attached: progress, both /metrics endpoints, a report"),
    "analyze": ("kvscope.agent.tools.analyze.commands", "", "offline report from an AIPerf output directory"),
    "what-if": ("kvscope.agent.analyses.whatif.commands", "",
                "hit shares and TTFT at other tier sizes (agent or recording)"),
}


def _load(args: argparse.Namespace) -> Config:
    return load_config_file(args.config, components(), flags=flags.flag_overrides(args))


def _preflight(config: Config) -> bool:
    found = preflight.check(config, components())
    for line in found.warnings:
        log.warning("%s", line)
    for line in found.problems:
        print(f"kvscope: {line}", file=sys.stderr)
    return not found.problems


def _run(args: argparse.Namespace) -> int:
    config = _load(args)
    logs.configure(config.agent.log_level, config.agent.log_format)
    if not _preflight(config):
        return 2
    try:
        agent = build_agent(config)
    except OSError as exc:
        raise ConfigError(f"exporters.prometheus.listen: cannot bind {config.exporter(PROMETHEUS).listen}: "
                          f"{exc.strerror}") from None
    signals = SignalWaiter((signal.SIGTERM, signal.SIGINT, signal.SIGHUP))
    agent.start()
    # What exists now (modules, classes, the wiring) lives as long as the agent: frozen out of the cyclic
    # collector's sight, a full collection walks only what came later. Unfrozen, each one walked ~34,000
    # objects for 7-18 ms of CPU, several scrapes' worth for an agent scraped every 15 s (docs/scheduler.md).
    gc.freeze()
    enabled = [j.name for j in agent.scheduler.jobs]
    where = ""
    if agent.server is not None:
        host = config.exporter(PROMETHEUS).listen.rpartition(":")[0]
        where = f" on {host}:{agent.server.port}/metrics"
    log.info("kvscope %s running%s; collectors and analyses: %s", __version__, where, ", ".join(enabled) or "none")
    _wait_for_stop(agent, signals)
    agent.stop()
    log.info("stopped")
    return 0


def _wait_for_stop(agent: Agent, signals: SignalWaiter) -> None:
    """Until SIGTERM or SIGINT. SIGHUP re-reads the web config files (TLS certificates, users) in place;
    one that fails to load is logged and the previous one stays in force. The work happens here, on the
    main thread (agent/runtime/os_signals.py: no lock is taken in a signal handler)."""
    while True:
        for signum in signals.wait():
            name = signum.name
            if signum != signal.SIGHUP:
                log.info("received %s, shutting down", name)
                return
            problems = agent.reload()
            for line in problems:
                log.error("received SIGHUP: %s; the previous web config stays in force", line)
            if not problems:
                log.info("received SIGHUP: web config files re-read")


def _config_check(args: argparse.Namespace) -> int:
    if args.file is not None:
        if args.config is not None:
            raise ConfigError("config check: give the file once (positional or --config)")
        args.config = args.file
    config = _load(args)
    if not _preflight(config):
        return 2
    enabled = [name for name, (settings, _) in [*config.collectors.items(), *config.analyses.items()]
               if settings.enabled]
    print(f"{args.config or '(embedded defaults)'}: ok; enabled: {', '.join(enabled) or 'none'}")
    return 0


def _config_defaults(_args: argparse.Namespace) -> int:
    from kvscope.agent.config.settings import defaults_toml

    sys.stdout.write(defaults_toml(components()))
    return 0


def _catalogue(args: argparse.Namespace) -> int:
    catalogue = build_catalogue()
    if args.markdown:
        sys.stdout.write(catalogue.markdown())
    else:
        for spec in catalogue:
            print(f"{spec.name}\t{spec.type}\t{','.join(spec.labels)}")
    return 0


def _command_of(argv: Sequence[str]) -> str | None:
    return next((a for a in argv if not a.startswith("-")), None)


def build_parser(argv: Sequence[str] = ()) -> argparse.ArgumentParser:
    """The parser; an extension command's own arguments are added only when `argv` names it."""
    parts = components()
    parser = argparse.ArgumentParser(prog="kvscope", description="Observability for KV-cache tiers.")
    parser.add_argument("--version", action="version", version=f"kvscope {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run the agent (sidecar mode)",
                         epilog="Precedence: a flag, then KVSCOPE_* environment variables, then the file, "
                                "then the defaults.")
    flags.add_flags(run, parts)
    run.set_defaults(func=_run)
    config = sub.add_parser("config", help="configuration tools")
    config_sub = config.add_subparsers(dest="config_command", required=True)
    check = config_sub.add_parser("check", help="check a configuration (file, environment, flags) and what "
                                                "running it needs; exit 2 on a problem")
    check.add_argument("file", nargs="?", help="TOML config file (or --config FILE)")
    flags.add_flags(check, parts)
    check.set_defaults(func=_config_check)
    defaults = config_sub.add_parser("defaults", help="print every key with its embedded default, as TOML")
    defaults.set_defaults(func=_config_defaults)
    version = sub.add_parser("version", help="print the version")
    version.set_defaults(func=lambda _a: print(f"kvscope {__version__}") or 0)
    catalogue = sub.add_parser("catalogue", help="list every metric kvscope can export")
    catalogue.add_argument("--markdown", action="store_true", help="as the README's Markdown table")
    catalogue.set_defaults(func=_catalogue)
    command = _command_of(argv)
    if command in EXTENSIONS:
        module, extra, _ = EXTENSIONS[command]
        if extra:
            extras.require(extra, f"kvscope {command}")
        importlib.import_module(module).add_commands(sub)
    else:
        for name, (_, _, help_text) in EXTENSIONS.items():
            sub.add_parser(name, help=help_text, add_help=False)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    logs.configure()
    try:
        args = build_parser(argv).parse_args(argv)
        return int(args.func(args))
    except ConfigError as exc:
        print(f"kvscope: config error: {exc}", file=sys.stderr)
        return 2
    except extras.MissingExtra as exc:
        print(f"kvscope: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
