"""kvscope: observability and telemetry for KV-cache tiers in LLM inference.

The one import name kvscope installs. Its four subpackages are the repository's top-level folders
(the user's design card), linked here so that the source tree, the tests and the installed wheel
import them by the same names:

- ``kvscope.agent``: the core (interfaces, readings, catalogue, configuration, store, scheduler, wiring,
  CLI), the correlation analysis, and beside it the reference pipeline, self-test and offline reports;
- ``kvscope.collectors``: one module per source;
- ``kvscope.exporters``: the sinks (Prometheus exposition and its HTTP server, JSON Lines);
- ``kvscope.dashboards``: Grafana dashboards and rules.
"""

__version__ = "0.1.0"
