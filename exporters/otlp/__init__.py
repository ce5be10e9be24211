"""The OTLP sinks: metrics and per-request attribution traces, and where they are sent."""
