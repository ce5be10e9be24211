"""The sinks: prometheus/ (exposition and the /metrics server), otlp/ (metrics and attribution traces),
jsonl.py. Each defines a `SPEC` (registry.py lists them); they read the store and the analyses' results
and never talk to collectors."""
