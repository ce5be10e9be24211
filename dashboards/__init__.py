"""Grafana dashboards as code, Prometheus recording and alert rules."""
