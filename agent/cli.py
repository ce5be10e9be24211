"""The `kvscope` command."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from collections.abc import Sequence

from kvscope import __version__
from kvscope.agent.config import ConfigError, load_config_file
from kvscope.collectors.registry import collector_specs

log = logging.getLogger("kvscope")


def _run(args: argparse.Namespace) -> int:
    from kvscope.agent.runtime import build_agent

    config = load_config_file(args.config, collector_specs())
    logging.getLogger().setLevel(config.agent.log_level.upper())
    try:
        agent = build_agent(config)
    except OSError as exc:
        raise ConfigError(f"exporters.prometheus.listen: cannot bind {config.exporters.prometheus.listen}: "
                          f"{exc.strerror}") from None
    stop = threading.Event()

    def on_signal(signum: int, _frame: object) -> None:
        log.info("received %s, shutting down", signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    agent.start()
    enabled = [j.name for j in agent.scheduler.jobs]
    where = ""
    if agent.server is not None:
        host = config.exporters.prometheus.listen.rpartition(":")[0]
        where = f" on {host}:{agent.server.port}/metrics"
    log.info("kvscope %s running%s; collectors: %s", __version__, where, ", ".join(enabled) or "none")
    stop.wait()
    agent.stop()
    log.info("stopped")
    return 0


def _config_check(args: argparse.Namespace) -> int:
    config = load_config_file(args.file, collector_specs())
    enabled = [name for name, (settings, _) in config.collectors.items() if settings.enabled]
    print(f"{args.file}: ok; collectors enabled: {', '.join(enabled) or 'none'}")
    return 0


def _config_defaults(_args: argparse.Namespace) -> int:
    from kvscope.agent.config import defaults_toml

    sys.stdout.write(defaults_toml(collector_specs()))
    return 0


def _catalogue(args: argparse.Namespace) -> int:
    from kvscope.agent.runtime import build_catalogue

    catalogue = build_catalogue()
    if args.markdown:
        sys.stdout.write(catalogue.markdown())
    else:
        for spec in catalogue:
            print(f"{spec.name}\t{spec.type}\t{','.join(spec.labels)}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kvscope", description="Observability for KV-cache tiers.")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run the agent (sidecar mode)")
    run.add_argument("--config", help="TOML config file (default: embedded defaults)")
    run.set_defaults(func=_run)
    config = sub.add_parser("config", help="configuration tools")
    config_sub = config.add_subparsers(dest="config_command", required=True)
    check = config_sub.add_parser("check", help="validate a config file and exit")
    check.add_argument("file")
    check.set_defaults(func=_config_check)
    defaults = config_sub.add_parser("defaults", help="print every key with its embedded default, as TOML")
    defaults.set_defaults(func=_config_defaults)
    version = sub.add_parser("version", help="print the version")
    version.set_defaults(func=lambda _a: print(f"kvscope {__version__}") or 0)
    catalogue = sub.add_parser("catalogue", help="list every metric kvscope can export")
    catalogue.add_argument("--markdown", action="store_true", help="as the README's Markdown table")
    catalogue.set_defaults(func=_catalogue)
    from kvscope.agent.reference.cli import add_commands
    from kvscope.agent.selftest.cli import add_commands as add_selftest_commands

    add_commands(sub)
    add_selftest_commands(sub)
    from kvscope.agent.analyze.cli import add_analyze_command

    add_analyze_command(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except ConfigError as exc:
        print(f"kvscope: config error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
