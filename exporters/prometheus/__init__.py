"""The Prometheus sink: exposition of the store (text and OpenMetrics) and the /metrics server."""
