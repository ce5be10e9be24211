"""kvscope: observability and telemetry for KV-cache tiers in LLM inference.

The one import name kvscope installs. This folder (package/ in the repository) is its root; the
repository's four top-level folders (the user's design card) are its subpackages, mapped by
pyproject.toml's package-dir, so each file has one name, `kvscope.…`:

- ``kvscope.agent``: ``core`` (interfaces, readings, catalogue, contract, tiers, store), ``config``,
  ``http`` (the server every endpoint runs on), ``runtime`` (scheduler, signals, logs), ``app`` (the
  wiring and the ``kvscope`` command), ``analyses`` (correlation, what-if) and ``tools`` (the reference
  pipeline, self-test and offline reports, which the sidecar never loads);
- ``kvscope.collectors``: one folder per family of sources (host, sharedfs, gpu, engines, kv_events,
  requests, scrape);
- ``kvscope.exporters``: the sinks (``prometheus``: exposition and /metrics; ``otlp``; JSON Lines);
- ``kvscope.dashboards``: Grafana dashboards and rules as code.
"""

__version__ = "0.1.0"
